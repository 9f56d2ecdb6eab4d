"""Reading what runs wrote: the anchor audit, re-scoring saved rollouts with other
estimators, the comparison study and the paper-setting table."""
