from paper_explorer.evaluation.errors import EvaluationError


class DecisionError(EvaluationError):
    """A typed decision file, request or run that cannot be used: one line, exit code 2."""
