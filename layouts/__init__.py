"""Layout-annotated einsums (`layouts.einsum`), the layout configuration the model loads (`layouts.config`), the
encoder layer's operators on annotated tensors (`layouts.layer`) and the global layout search
(`python -m layouts.search`, solved by `layouts.solver`). See README.md, "Layouts".

Only the light modules are imported here: `jaxformer.config` imports `layouts.config`, and `layouts.search` /
`layouts.timing` import jaxformer, so they must not load with the package.
"""

from .config import CANDIDATES, LOGICAL, LayoutConfig, load

# Not re-exported: `einsum` (the function) would shadow the submodule `layouts.einsum` that the model imports.
__all__ = ["CANDIDATES", "LOGICAL", "LayoutConfig", "load"]
