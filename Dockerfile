# EagleGen worker / collector / producer / flower image (core only: no torch).
FROM python:3.11.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app

# Dependency layer: only pyproject.toml, so code edits don't reinstall dependencies.
COPY pyproject.toml README.md ./
RUN mkdir -p common producer worker collector simulator training cli \
    && for p in common producer worker collector simulator training cli; do touch $p/__init__.py; done \
    && pip install . && pip uninstall -y eaglegen

COPY common ./common
COPY producer ./producer
COPY worker ./worker
COPY collector ./collector
COPY simulator ./simulator
COPY training ./training
COPY cli ./cli
COPY data ./data
RUN pip install --no-deps . && useradd --create-home --uid 10001 eaglegen \
    && mkdir -p /data && chown eaglegen /data
USER eaglegen
ENTRYPOINT ["eaglegen"]
CMD ["--help"]
