# syntax=docker/dockerfile:1
# streamstate images. Targets:
#   worker (the default, last stage)  the faust worker with its HTTP API on $WEB_PORT
#   batch                             Java 17 + PySpark for the nightly recompute job
#
#   docker build -t streamstate-worker .
#   docker build --target batch -t streamstate-batch .
#
# The dependencies are layers of their own, made from pyproject.toml alone, in a virtualenv
# that stays where it was made: the images are built FROM it rather than copying it (a copy
# from another stage is checksummed file by file at every build, even when cached). The
# project is built as a wheel and installed in a stage of its own (`project`), and each
# image copies that installed tree onto its virtualenv as its last layer: a change to the
# code alone reruns one pip command and two small copies, and resolves or downloads nothing.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS python-base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

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

# --- dependencies: the virtualenv at /opt/venv with the dependencies and the wheel's build
# tools, root-owned ---
FROM runtime AS dependencies
COPY pyproject.toml /src/pyproject.toml
COPY ops/docker/requirements.py /src/ops/docker/requirements.py
# pip's index, when not PyPI (ops/docker/cluster.sh passes the one pip is configured with).
ARG PIP_INDEX_URL
RUN python -m venv /opt/venv \
    && python /src/ops/docker/requirements.py >/tmp/requirements.txt \
    && python /src/ops/docker/requirements.py --build-system >/tmp/build.txt \
    && pip install --no-cache-dir -r /tmp/requirements.txt -r /tmp/build.txt \
    && rm /tmp/requirements.txt /tmp/build.txt

# --- project: the project's wheel, built with the dependencies' build tools and installed
# without its dependencies (in /opt/venv already) under /project, laid out as in /opt/venv;
# the build context is the sources and pyproject.toml only (.dockerignore) ---
FROM dependencies AS project
WORKDIR /src
COPY . /src/
# One pip process builds the wheel and installs it, its bytecode compiled.
RUN pip install --no-cache-dir --no-deps --no-index --no-build-isolation --root /project .

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

# --- batch: the nightly scheduler and the PySpark job: Java 17, the `batch` extra (pyspark,
# pyarrow, ...) and Spark's Kafka source on the dependencies ---
FROM dependencies AS batch
# Debian's JRE postinst writes man page links; slim images drop /usr/share/man.
# hadolint ignore=DL3008
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
    && rm -rf /var/lib/apt/lists/*
ARG PIP_INDEX_URL
RUN python /src/ops/docker/requirements.py batch >/tmp/batch.txt \
    && pip install --no-cache-dir -r /tmp/batch.txt \
    && rm /tmp/batch.txt
# Into pyspark's own jars folder, so that every SparkSession has the Kafka source
# without network access or configuration; artifacts pyspark ships are left alone.
COPY ops/docker/spark_jars.py /src/ops/docker/spark_jars.py
COPY --from=spark-kafka /opt/spark-kafka /tmp/spark-kafka
RUN python /src/ops/docker/spark_jars.py /tmp/spark-kafka && rm -rf /tmp/spark-kafka
USER 10001:10001
CMD ["python", "-m", "ops.nightly"]
# Last: the project's code, owned by root like the rest of the virtualenv.
COPY --from=project /project/opt/venv /opt/venv

# --- worker (default target): faust worker + FastAPI on the worker's own event loop ---
FROM dependencies AS worker
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
# Last: the project's code, owned by root like the rest of the virtualenv.
COPY --from=project /project/opt/venv /opt/venv
