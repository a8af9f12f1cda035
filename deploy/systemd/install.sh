#!/usr/bin/env bash
# Install a Tidewater capture as a systemd service on this host (run as root from a checkout):
#   * system user and group `tidewater` (no login, home /var/lib/tidewater);
#   * /opt/tidewater/.venv with this checkout installed (python3 >= 3.11);
#   * /etc/tidewater/server.toml and /etc/tidewater/tidewater.env (0640 root:tidewater), kept if present;
#   * /var/lib/tidewater (0750 tidewater:tidewater: the sorter's data dir);
#   * /etc/systemd/system/tidewater.service, then `systemctl daemon-reload` where systemd runs.
# Then edit /etc/tidewater/tidewater.env (etcd endpoints, address) and `systemctl enable --now tidewater`.
#
# Environment: DESTDIR=/path installs under another root (packaging, tests; no user, venv or systemctl
# there), TIDEWATER_USER (default tidewater), SKIP_VENV=1 keeps an existing /opt/tidewater/.venv.
set -euo pipefail

SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DESTDIR=${DESTDIR:-}
USER_NAME=${TIDEWATER_USER:-tidewater}
PYTHON=${PYTHON:-python3}
log() { printf 'install: %s\n' "$*" >&2; }

if [ -z "$DESTDIR" ] && [ "$(id -u)" -ne 0 ]; then
    log "run as root (or set DESTDIR to stage the files elsewhere)"; exit 1
fi

if [ -z "$DESTDIR" ] && ! id -u "$USER_NAME" >/dev/null 2>&1; then
    log "creating system user $USER_NAME"
    useradd --system --user-group --home-dir /var/lib/tidewater --no-create-home \
            --shell /usr/sbin/nologin --comment "Tidewater CDC" "$USER_NAME"
fi
group=$(id -gn "$USER_NAME" 2>/dev/null || echo root)

install -d -m 0755 "$DESTDIR/opt/tidewater" "$DESTDIR/etc/systemd/system"
install -d -m 0750 -o root -g "$group" "$DESTDIR/etc/tidewater"
install -d -m 0750 -o "$USER_NAME" -g "$group" "$DESTDIR/var/lib/tidewater"

for f in server.toml tidewater.env; do
    if [ -e "$DESTDIR/etc/tidewater/$f" ]; then
        log "keeping existing /etc/tidewater/$f"
    else
        install -m 0640 -o root -g "$group" "$SRC/deploy/systemd/$f" "$DESTDIR/etc/tidewater/$f"
    fi
done
install -m 0644 "$SRC/deploy/systemd/tidewater.service" "$DESTDIR/etc/systemd/system/tidewater.service"
install -d -m 0755 "$DESTDIR/opt/tidewater/docs"
install -m 0644 "$SRC/docs/operations.md" "$SRC/docs/metrics.md" "$DESTDIR/opt/tidewater/docs/"  # Documentation=

if [ -z "$DESTDIR" ] && [ "${SKIP_VENV:-0}" != 1 ]; then
    log "installing the project into /opt/tidewater/.venv"
    "$PYTHON" -m venv /opt/tidewater/.venv
    /opt/tidewater/.venv/bin/pip install -q --disable-pip-version-check "$SRC[kafka]"  # kafka: the Kafka sink
fi

if [ -z "$DESTDIR" ] && [ -d /run/systemd/system ]; then
    systemctl daemon-reload
    log "installed; edit /etc/tidewater/tidewater.env, then: systemctl enable --now tidewater"
else
    log "installed under ${DESTDIR:-/} (systemd not running here: no daemon-reload)"
fi
