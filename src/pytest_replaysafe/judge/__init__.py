"""How a cell is judged: what happened (:mod:`.evidence`), the verdict in one place (:mod:`.verdict`, answers and
records compared in :mod:`.provenance`), the outcomes (:mod:`.outcome`), the known gaps (:mod:`.gaps`), the
in-doubt windows (:mod:`.exposure`) and what the matrix reached (:mod:`.coverage`)."""
