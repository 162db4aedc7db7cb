# Stand-in for minio/minio and minio/mc (tests only): moto's S3 server on :9000, which accepts the
# stack's credentials, and make-bucket.py for the one-shot `minio-bucket` service.
FROM yue2-offline/python:3.11
RUN pip install --no-cache-dir "moto[server]>=5"
COPY make-bucket.py /usr/local/bin/make-bucket
CMD ["moto_server", "-H", "0.0.0.0", "-p", "9000"]
