"""An OpenAI-compatible HTTP server over one `polyspec.Engine` (`polyspec serve`).

app.py      the FastAPI app: /v1/completions, /v1/chat/completions (streamed as server-sent
            events), /v1/models, /health, /metrics, OpenAI-style errors
schemas.py  the request bodies, with their ranges; unknown fields are refused
worker.py   the one worker thread that runs queued requests one at a time, first come first served
metrics.py  counters, in Prometheus' text format
cli.py      the `serve` command
"""
