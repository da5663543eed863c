"""tilekiln's build system: catalog -> validate -> render -> compile -> link -> bundle.

Imports pydantic, jinja2, PyYAML and (in compile workers only) the CuTe DSL.
The runtime package ``tilekiln`` never imports this package; this package
takes its version from the runtime, so the two always agree.
"""

from tilekiln import __version__

__all__ = ["__version__"]
