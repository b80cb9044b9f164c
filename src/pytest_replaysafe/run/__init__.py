"""Running a cell: the test author's ``crash_run`` (:mod:`.harness`) and the cell's driver (:mod:`.driver`), one
hit's schedule played (:mod:`.hitrun`), the crash and resume modes (:mod:`.modes`, :mod:`.resumes`), child
processes (:mod:`.procs`), storage faults and a second worker (:mod:`.faults`, :mod:`.intruder`), the ledger spy
(:mod:`.spy`) and the effects counted outside the process (:mod:`.effects`)."""
