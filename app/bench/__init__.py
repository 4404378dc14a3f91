"""`specgen bench`: methods side by side on the same prompts, and the studies recorded in benchmarks/.

What every bench shares:
- prompts.py: the prompt files (JSON Lines), read with one set of checks.
- runner.py: the order of runs (prompts x repeats, variants rotated per round) and the progress bar.
- stats.py: medians and bootstrap 95 % intervals over prompts.
- records.py: where records go (`record_dirs`) and the environment every record holds (`start_run`, `run_env`).
- report.py: writing a record (JSON, figures, Markdown, `*-latest` copies) and what every report shares.

The benches (each plugs into the above):
- text.py, text_runner.py, text_report.py: `specgen bench text`, ours against the Hugging Face peers.
- image.py: `specgen bench image|video`, plain and Jacobi decoding over windows.
- lantern.py: `specgen bench lantern` (and image's head methods), EAGLE head, LANTERN and LANTERN++.
- speech.py, speech_scoring.py, speech_frontier.py: `specgen bench speech|speech-frontier`, and the
  speed/quality frontier of the relaxed speech rules.
- tetris.py: `specgen bench tetris`, TETRIS against fixed-length drafting in a batch.
- calibrate.py: `specgen bench calibrate`, Sequoia's acceptance vector and the tree budget sweep.
"""
