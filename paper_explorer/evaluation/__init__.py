"""What a policy did: QASPER metrics, retrieval quality, statistics, behavioural detectors, preregistration, reports."""
