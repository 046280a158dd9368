"""Built-in components: population and workload, losses, optimizers, gradient transforms.

Importing a module registers its components; :mod:`axoexp.plugins` imports them all.
"""
