"""The PPO learner: padding straight from the step table's columns, the losses,
memory-bounded log-probs, FSDP2 sharding and the behaviour-cloning warm-up."""
