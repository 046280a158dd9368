"""Built-in components; importing this package registers them."""

from axoexp.components import gradient_transforms, losses, optimizers, population

__all__ = ["gradient_transforms", "losses", "optimizers", "population"]
