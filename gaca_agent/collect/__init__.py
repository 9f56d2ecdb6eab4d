"""Playing episodes: the collector (turns of every live episode to the policy, actions to
the environments, one step table out), its env worker processes and the pool of sessions
on env servers."""
