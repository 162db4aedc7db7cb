# Stand-in for python:3.11-slim (tests only; built by build-standins.sh, no registry): Debian's
# python3.11 in a virtual environment on PATH, as `python` and `pip`, and a wheelhouse of every
# dependency of the project (torch's CPU wheel included) that pip installs from, offline.
FROM yue2-offline/debian:bookworm
RUN python3 -m venv /usr/local/python
ENV PATH=/usr/local/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8 PIP_NO_INDEX=1 PIP_FIND_LINKS=/wheels PIP_DISABLE_PIP_VERSION_CHECK=1
COPY wheels /wheels
CMD ["python3"]
