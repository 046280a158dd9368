"""python -m axoexp.report: a sweep's runs as a table and a figure, next to the sweep's outputs.

Reads the children of a sweep's parent run (the newest sweep unless --parent names
one) plus the earlier runs its jobs reused (marked as such), and prints one row per config
and executor (sweep.repeats pooled): shape, executor, status, median update ms with p10/p90,
capture ms, speedup over the eager runs of the same settings (a 95% bootstrap interval where
both have 2 or more runs; an eager row shows —), and the swept settings. The table prints as text, markdown,
CSV or JSON (--format). The figure shows median latency against the swept dimension
(p10-p90 bars; the other swept settings as panels, executors as colours) and the speedup
over eager per executor. Both are written to the sweep's output directory and logged to the
parent run, except where the store is read-only (only read, it still serves): the last line says so.
A --parent that is no sweep is one line instead: a single run's result, or a sweep's job's with the
command that reports its sweep; so is a sweep without runs (every job refused, or its launcher
failed), with the reason it ended.

Runs measured under contention, with high noise, or logged without those labels (an older store's:
a timing whose load was not recorded cannot claim to be quiet) form rows of their own, marked in the
contention and noise columns and hollow in the figure, without a speedup, and are no eager baseline,
unless --include-contended pools them; compare sets them apart by the same rule (axoexp.statistics.timing_doubts).

Runs with batches of different lengths (population.lengths) add a table per length bucket
(bucket, the lengths it holds, updates, median, p10, p90, padding overhead; with --format csv
the file report_buckets.csv) and the figure report_lengths.png: each bucket's median latency
against length, p10-p90 bars, bucket boundaries dotted, one series per executor and settings
(docs/lengths.md).

One module per job: rows.py (runs to rows), table.py (rows as text, markdown, CSV or JSON),
figure.py (the figure), length_figure.py (latency against length), pareto.py (a search's Pareto
front) and __main__.py (the command). None imports torch or the executors.

Exit status (axoexp.readers): 0 done; 2 with one line on bad input (no sweep, an unknown --experiment or --parent,
an --out where no file can be written, checked before the store is read, or a sweep's output
directory where none can, checked before anything is printed) or a store that is no usable MLflow
store (damaged, half-built, an older schema, a file store, another application's file, a database
without its driver); 1 with one line where the store failed (locked by another process for 20 s, a
server that does not answer) or a file could not be written after the table was printed (a full
disk): the same command may work later; 130 with one line on Ctrl-C.
A reader that stops early (| head) is no fault: the files are still written, exit 0.
"""
