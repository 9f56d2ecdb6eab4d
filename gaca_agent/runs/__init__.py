"""A run's files: the run directory (metrics, checkpoints, rollouts), episode records and
results, the HTML report and the plots."""
