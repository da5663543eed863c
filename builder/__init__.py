"""tilekiln's build system: catalog -> validate -> render -> compile -> link -> bundle.

Imports pydantic, jinja2, PyYAML and (in compile workers only) the CuTe DSL.
The runtime package ``tilekiln`` never imports this package.
"""

import importlib.metadata

__version__ = importlib.metadata.version("tilekiln")
