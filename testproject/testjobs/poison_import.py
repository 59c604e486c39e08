"""A module that fails at import: a job naming a task in it must end dead, not wedge a worker."""

raise ValueError("this module cannot be imported")
