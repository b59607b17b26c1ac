# The CSTP server image: the project and its offline embedding model, nothing fetched at run time.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /srv/cstp

# A plain install (the tokenizer and the migration scripts are package data of app/); the
# source is removed afterwards, so only the installed package can ever be imported.
COPY pyproject.toml README.md /tmp/cstp-src/
COPY app /tmp/cstp-src/app
RUN pip install --no-cache-dir /tmp/cstp-src \
 && rm -rf /tmp/cstp-src \
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
# One process on the embedded SQLite file and index in /var/lib/cstp/data. Several workers need
# a Chroma server (docker-compose.yml runs them on PostgreSQL, Chroma and Redis).
CMD ["cstp", "serve"]
