"""What a sweep is asked to be: the schema, its typed form, composing it, the values it takes, its `--help`,
instantiating its `_target_` nodes, and the cost estimate the schema prices trials with. Imports no other
group of sweeps."""
