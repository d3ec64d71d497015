# Stand-in for redis:7-alpine, from Debian's redis-server (7.0): same entry point contract
# (docker-entrypoint.sh redis-server … drops root to the redis user), /data as working directory.
ARG ROOTFS=eaglegen-local/bookworm-rootfs:latest
FROM ${ROOTFS}
COPY redis-entrypoint.sh /usr/local/bin/docker-entrypoint.sh
RUN mkdir -p /data && chown redis:redis /data
WORKDIR /data
VOLUME /data
ENTRYPOINT ["docker-entrypoint.sh"]
CMD ["redis-server"]
