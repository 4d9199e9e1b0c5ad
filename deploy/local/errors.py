"""The one error the local stack raises."""


class StackError(RuntimeError):
    """A component could not be started or stopped, or the stack could not be set up."""
