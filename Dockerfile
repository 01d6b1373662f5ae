# tim-enhance HTTP/WebSocket service, CPU only: POST /v1/enhance, POST /v1/analyze, WS /v1/stream, the web page
# at /, OpenAPI docs at /docs, /healthz, /readyz, /metrics.
#
# Health: the HEALTHCHECK asks /readyz (200 once the models are loaded), so a container whose model failed to load
# is reported unhealthy; /healthz only says the process answers.
#
# Build (from the repository root):
#   docker build -t tim-enhance-server .
# Run (the bundled default model, 2 enhancements at once):
#   docker run --rm -p 8000:8000 tim-enhance-server
#   curl -fsS localhost:8000/readyz && curl -fsS -H 'Content-Type: audio/wav' --data-binary @examples/noisy.wav \
#        localhost:8000/v1/enhance -o clean.wav
# With an API key, 2 threads per enhancement, CORS for a front end (any enhance-server flag goes after the image name):
#   docker run --rm -p 8000:8000 -e ENHANCE_API_KEY=change-me --cpus 4 tim-enhance-server \
#       --max-concurrency 2 --threads 2 --cors-origin https://app.example
# Stopping: `docker stop` sends SIGTERM and kills the process 10 s later, while the server gives running requests
# and open streams up to --graceful-timeout (25 s, for Kubernetes' 30-s grace period) to finish. Give docker the
# time (`docker run --stop-timeout 30 ...`; compose: `stop_grace_period: 30s`), or pass `--graceful-timeout 8`.
# Another model (a checkpoint made by the training recipes), mounted read-only:
#   docker run --rm -p 8000:8000 -v "$PWD/runs/tim:/models:ro" tim-enhance-server --checkpoint /models/best.safetensors
#
# The bundled model is inside the package (models/pretrained/default.safetensors, no download at run time). Its
# model card says the weights are internal R&D material (noise licences): do not push this image to a public
# registry. The container runs as the unprivileged user "app"; it writes only temporary files (multipart uploads
# over 1 MiB, PNG figures) under /tmp.
#
# Streams run on the C step (`auto` takes `native`; `native-fp16` / `native-int8` by name). The image has no C
# compiler: a build stage compiles enhance/native_step.c once per x86-64 level (v4: AVX-512, v3: AVX2/FMA/F16C, v2,
# baseline; one generic build on other processors) into /opt/tim-enhance/native, and the server loads the one for
# the highest level the host's CPU has ($TIM_ENHANCE_PREBUILT; enhance/native_build.py). /v1/models names the
# backend each model's streams use.

FROM python:3.11-slim AS native
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*
COPY enhance/native_build.py enhance/native_step.c /build/
RUN python -I /build/native_build.py --prebuild /opt/tim-enhance/native

FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    OMP_NUM_THREADS=1 \
    TIM_ENHANCE_PREBUILT=/opt/tim-enhance/native

# CPU-only PyTorch first (its own index), in a layer of its own so code changes do not reinstall it.
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu

WORKDIR /src
COPY pyproject.toml README.md ./
COPY models ./models
COPY enhance ./enhance
COPY server ./server
# recipes: the package declares the tim-train / tim-evaluate commands; without it they would be installed and fail
COPY recipes ./recipes
# serve: FastAPI, uvicorn, python-multipart (+ websockets for WS /v1/stream); viz: matplotlib for ?format=png
# The checks run from / so that they see the installed package, not /src: the model and the page must be in it.
RUN pip install ".[serve,viz]" "websockets>=13" \
    && cd / && rm -rf /src \
    && python -c "from models.pretrained import pretrained_path; print('bundled model:', pretrained_path())" \
    && python -c "import server.app as a; assert (a.STATIC_DIR / 'index.html').is_file(), 'web page not installed: add server = [\"static/*\"] to [tool.setuptools.package-data]'"

# the C step's libraries, built for the source installed above (its SHA-256 is in their names)
COPY --from=native /opt/tim-enhance/native /opt/tim-enhance/native
RUN cd / && python -c "from enhance.native_backend import library; print('native step:', library()._name)"

RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin app
USER app
WORKDIR /home/app

EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/readyz', timeout=4).status == 200 else 1)"]

ENTRYPOINT ["enhance-server", "--host", "0.0.0.0", "--port", "8000"]
CMD []
