"""The study and its record: the search space, opening and defining a study, drawing a trial within the budget
and without repeats, and what is left queued. Built on sweeps.config only."""
