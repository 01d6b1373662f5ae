"""The HTTP/WebSocket service: ``create_app`` in :mod:`server.app`, the ``enhance-server`` command in
:mod:`server.main`, settings in :mod:`server.config`. Needs the ``serve`` extra (FastAPI, uvicorn)."""
