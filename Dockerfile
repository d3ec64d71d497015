# EagleGen image for every role: worker, collector, producer, Flower, simulator.
# Core only: no torch, no [train] extra (tokenization runs elsewhere, see training/).
# Pinned base; pin it by digest too (python:3.11.11-slim-bookworm@sha256:…) where your
# registry policy asks for it. PYTHON_IMAGE: the same from an internal registry, or a base
# built without one (docs/deployment.md, "Without Docker Hub"); PIP_INDEX_URL: a PyPI mirror.
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm
FROM ${PYTHON_IMAGE}
ARG PIP_INDEX_URL=https://pypi.org/simple

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app

# Dependency layer: the [project] dependencies of pyproject.toml and nothing else, so code
# edits reuse it and the image holds exactly what the project declares.
COPY pyproject.toml ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

# The packages of [tool.setuptools.packages.find] include, then the project itself.
COPY README.md ./
COPY common ./common
COPY producer ./producer
COPY broker ./broker
COPY worker ./worker
COPY collector ./collector
COPY simulator ./simulator
COPY training ./training
COPY cli ./cli
COPY capture ./capture
COPY data ./data
RUN pip install --no-deps . \
    && useradd --create-home --uid 10001 eaglegen \
    && mkdir -p /data && chown eaglegen /data
USER eaglegen

# Every role needs Redis: unhealthy when the configured Redis (plain, TLS or Sentinel) does not
# answer. docker-compose.yml gives the worker, Flower and the simulator checks of their own.
HEALTHCHECK --interval=30s --timeout=10s --start-period=30s --retries=3 \
    CMD ["python", "-c", "from common.settings import Settings; from common.store import connect; s = Settings(); connect(s.redis_url, s.redis_sentinel_master).ping()"]

ENTRYPOINT ["eaglegen"]
CMD ["--help"]
