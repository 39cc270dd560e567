"""`trainformer serve`: an exported model behind TF Serving's REST API, with dynamic batching.

model.py loads the export and calls its signatures; protocol.py turns TF Serving's JSON into
arrays and back; batching.py merges concurrent requests into one model call on one worker
thread; metrics.py holds the Prometheus series; app.py is the FastAPI app; server.py checks
MODEL_DIR and the port, then runs uvicorn.
"""
