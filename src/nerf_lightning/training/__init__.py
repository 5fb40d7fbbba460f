"""What a run's schedules count and how the data and the model talk: the batch rule, the training clock,
the learning-rate schedules and the training feedback."""
