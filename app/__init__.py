"""The Gradio app, the CLI, the batch runner and benchmarks (nothing heavy at import)."""
