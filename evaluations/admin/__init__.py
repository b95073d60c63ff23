"""The Django admin: Django imports this package, which registers each model's admin."""

from evaluations.admin import batches, evaluations, sandboxes, tokens  # noqa: F401 (they register themselves)
