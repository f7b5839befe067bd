"""Space files: YAML -> validated Space (schema, param values, conditions, constraints)."""

__all__ = ["schema", "space", "values"]
