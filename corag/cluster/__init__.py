"""Running on a Slurm cluster: the request check against `sinfo` (`submit`), the stop/requeue protocol
every stage imports (`stop`), the batch shell (`requeue`), the node runner every launch script execs
(`node`), this node's retrieval service (`node_service`), iterate's jobs (`rounds`) and the other job
internals (the pool job, the rendezvous store, accelerate's join)."""
