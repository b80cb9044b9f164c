"""What a crash matrix is made of: its cells (point x backend x mode, :mod:`.cells`), the backends and the services
they need (:mod:`.services`), the completion orders of parallel calls (:mod:`.orders`) and the schedules of a
cell's executions (:mod:`.schedules`). The bottom of the plugin: it imports no other part of it."""
