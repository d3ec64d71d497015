# Stand-in for python:3.11-slim-bookworm, from Debian's own python3 (3.11): `python` and `pip`
# on PATH, pip installing into /usr/local as in the official image. Built by
# scripts/local_base_images.sh from a debootstrap root file system; nothing comes from a registry.
ARG ROOTFS=eaglegen-local/bookworm-rootfs:latest
FROM ${ROOTFS}
ENV LANG=C.UTF-8 PIP_CERT=/etc/ssl/certs/ca-certificates.crt
CMD ["python"]
