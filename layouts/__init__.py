"""Layout-annotated einsums (`layouts.einsum`), the layout configuration the model loads (`layouts.config`) and the
shortest-path solver of the global layout search (`layouts.solver`; the search itself, which times the model's
operators, is `python -m jaxformer.layout_search`). See docs/layouts.md.
"""

from .config import CANDIDATES, LOGICAL, LayoutConfig, load

# Not re-exported: `einsum` (the function) would shadow the submodule `layouts.einsum` that the model imports.
__all__ = ["CANDIDATES", "LOGICAL", "LayoutConfig", "load"]
