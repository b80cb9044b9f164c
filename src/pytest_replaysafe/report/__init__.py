"""What a person sees of a matrix: the text grid (:mod:`.grid`), the JSON and Markdown reports and closing lines
(:mod:`.outputs`), the HTML page (:mod:`.html` + ``report.html``), a cell's story (:mod:`.timeline`), progress
lines (:mod:`.progress`) and a report read back to replay its failures (:mod:`.replay`)."""
