"""`trainformer serve`: exported models behind TF Serving's REST and gRPC APIs, with dynamic
batching and versions managed as TF Serving does.

model.py loads one version folder and calls its signatures; versions.py finds the version
folders under each base path, loads new ones while serving and unloads the old; protocol.py
turns TF Serving's JSON into arrays and back; rpc.py is the gRPC API (tensorflow-serving-api's
protos); batching.py merges concurrent requests of both APIs into one model call on one worker
thread; metrics.py holds the Prometheus series; app.py is the FastAPI app; server.py checks the
base paths and the ports, then runs uvicorn and the gRPC server.
"""
