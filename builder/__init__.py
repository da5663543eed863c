"""tilekiln's build system: catalog -> validate -> render -> compile -> link -> bundle.

Imports pydantic, jinja2, PyYAML and (in compile workers only) the CuTe DSL.
The runtime package ``tilekiln`` never imports this package; this package
takes its version from the runtime, and its distribution (tilekiln-build)
pins the runtime's (tilekiln-runtime) to that same version.
"""

from tilekiln import __version__

__all__ = ["__version__"]
