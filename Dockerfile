# syntax=docker/dockerfile:1
# streamstate images. Targets:
#   worker (the default, last stage)  the faust worker with its HTTP API on $WEB_PORT
#   batch                             Java 17 + PySpark for the nightly recompute job
#
#   docker build -t streamstate-worker .
#   docker build --target batch -t streamstate-batch .
#
# The dependencies install in layers of their own (from pyproject.toml), the project is
# built as a wheel in a stage of its own and installed last on top of them: a change to the
# code alone rebuilds the wheel and one small layer of each image, in seconds.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS python-base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# --- builder: a virtualenv at /opt/venv with the dependencies and the wheel's build tools ---
FROM python-base AS builder
WORKDIR /src
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
COPY pyproject.toml ./
COPY ops/docker/requirements.py ops/docker/requirements.py
# pip's index, when not PyPI (ops/docker/cluster.sh passes the one pip is configured with).
ARG PIP_INDEX_URL
RUN python ops/docker/requirements.py >/tmp/requirements.txt \
    && python ops/docker/requirements.py --build-system >/tmp/build.txt \
    && pip install --no-cache-dir -r /tmp/requirements.txt -r /tmp/build.txt

# --- wheel: the project's wheel, built with the builder's tools (nothing downloaded) ---
FROM builder AS wheel
# The wheel's metadata reads README.md.
COPY README.md ./
COPY core ./core
COPY app ./app
COPY agents ./agents
COPY streams ./streams
COPY tables ./tables
COPY api ./api
COPY jobs ./jobs
COPY ops ./ops
RUN pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /wheels .

# --- spark-kafka: Spark's Kafka source for the pyspark that pyproject.toml pins ---
FROM python-base AS spark-kafka
# hadolint ignore=DL3008
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends maven \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml ./
COPY ops/docker/requirements.py ops/docker/requirements.py
COPY ops/docker/spark-kafka/pom.xml ops/docker/spark-kafka/pom.xml
# Options of Maven's JVM: a trust store for Maven Central behind a proxy, for instance
# (ops/docker/cluster.sh passes the host's under podman).
ARG MAVEN_OPTS=""
RUN mvn -q -B -f ops/docker/spark-kafka/pom.xml dependency:copy-dependencies \
      -DincludeScope=runtime -DoutputDirectory=/opt/spark-kafka \
      -Dspark.version="$(python ops/docker/requirements.py --pin pyspark)"

# --- builder-batch: the same virtualenv plus the `batch` extra (pyspark, pyarrow, ...) ---
FROM builder AS builder-batch
ARG PIP_INDEX_URL
RUN python ops/docker/requirements.py batch >/tmp/batch.txt \
    && pip install --no-cache-dir -r /tmp/batch.txt
# Into pyspark's own jars folder, so that every SparkSession has the Kafka source
# without network access or configuration; artifacts pyspark ships are left alone.
COPY ops/docker/spark_jars.py ops/docker/spark_jars.py
COPY --from=spark-kafka /opt/spark-kafka /tmp/spark-kafka
RUN python ops/docker/spark_jars.py /tmp/spark-kafka && rm -rf /tmp/spark-kafka

# --- runtime: what both images share; a non-root user owning /data ---
FROM python-base AS runtime
# A numeric USER lets `runAsNonRoot`-style checks verify it without reading /etc/passwd.
RUN groupadd --system --gid 10001 streamstate \
    && useradd --system --uid 10001 --gid streamstate --create-home \
       --home-dir /home/streamstate --shell /usr/sbin/nologin streamstate \
    && install -d -o streamstate -g streamstate /data /var/lib/streamstate
ENV PATH=/opt/venv/bin:$PATH \
    APP_DATADIR=/data
WORKDIR /var/lib/streamstate

# --- batch: the nightly scheduler and the PySpark job ---
FROM runtime AS batch
# Debian's JRE postinst writes man page links; slim images drop /usr/share/man.
# hadolint ignore=DL3008
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
    && rm -rf /var/lib/apt/lists/*
COPY --from=builder-batch /opt/venv /opt/venv
COPY --from=wheel /wheels /wheels
RUN pip install --no-cache-dir --no-deps --no-index /wheels/*.whl
USER 10001:10001
CMD ["python", "-m", "ops.nightly"]

# --- worker (default target): faust worker + FastAPI on the worker's own event loop ---
FROM runtime AS worker
COPY --from=builder /opt/venv /opt/venv
COPY --from=wheel /wheels /wheels
RUN pip install --no-cache-dir --no-deps --no-index /wheels/*.whl
# WEB_HOST is the canonical host that peers route to and the address uvicorn binds to;
# unset, it is the container's hostname (which Docker maps to the container's address).
ENV WEB_PORT=6066
EXPOSE 6066
USER 10001:10001
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, socket, urllib.request; urllib.request.urlopen('http://%s:%s/health' % (os.environ.get('WEB_HOST') or socket.gethostname(), os.environ.get('WEB_PORT', '6066')), timeout=4)"]
# The contract's worker command; sh only expands WEB_HOST/WEB_PORT, then execs faust
# so that it receives SIGTERM from `docker stop` directly.
CMD ["sh", "-c", "exec faust --datadir /data -A app.main worker -l info --web-host \"${WEB_HOST:-$(hostname)}\" --web-port \"${WEB_PORT}\""]
