# syntax=docker/dockerfile:1
# Baton's GPU image, the Helm chart's default (deploy/helm/baton: image baton:<appVersion>).
#   make image        # docker build -t baton:VERSION -f Dockerfile .
# Every process is the `baton` command: `baton router ...`, `baton worker --role prefill ...`.
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu22.04

FROM ${CUDA_IMAGE} AS build
ARG TORCH_VERSION=2.13.0
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.11 python3.11-venv make \
    && rm -rf /var/lib/apt/lists/*
RUN python3.11 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# torch first, in its own layer (PyPI's Linux wheel is the CUDA build): code changes keep it cached.
RUN pip install --upgrade pip && pip install "torch==${TORCH_VERSION}"
WORKDIR /src
COPY pyproject.toml README.md Makefile ./
COPY proto proto
# The gRPC modules are generated, never committed: `make proto` with this venv. Its setup stamp is
# touched so make does not set up a development venv (test extras) here.
RUN pip install "grpcio-tools>=1.60" \
    && touch /opt/venv/.installed \
    && make proto VENV=/opt/venv \
    && pip uninstall -y grpcio-tools
COPY cli cli
COPY common common
COPY deploy deploy
COPY kernels kernels
COPY loadtest loadtest
COPY mismatch mismatch
COPY router router
COPY sdk sdk
COPY services services
COPY tools tools
COPY trainer trainer
RUN pip install .

FROM ${CUDA_IMAGE}
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.11 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 1000 baton
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1
USER 1000
WORKDIR /home/baton
# router: gRPC 50051, HTTP 8000, metrics 9090; workers: gRPC 50061, metrics 9091 (the chart's defaults).
EXPOSE 50051 8000 9090 50061 9091
ENTRYPOINT ["baton"]
CMD ["--help"]
