"""Typed decisions: closed questions of three kinds (yes/no/unknown, one of k, a rubric score)
about a document, answered with a probability for every option from the option's whole
continuation under the model (``explorer decide``, ``explorer serve``)."""
