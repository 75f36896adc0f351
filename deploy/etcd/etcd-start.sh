# Starts this etcd member, first rejoining the cluster when the member lost its data.
#
# etcd reads its settings from the ETCD_* variables of the container. This script decides
# only ETCD_INITIAL_CLUSTER_STATE (and, on a rejoin, ETCD_INITIAL_CLUSTER), then replaces
# itself with etcd:
#
#   - the data dir holds a write-ahead log: start as is (etcd ignores both variables);
#   - the data dir is empty and another member is healthy (the cluster has a quorum): the
#     member lost its disk, or never started while its peers formed the cluster. Remove
#     the member entry that has this member's peer URL (its data is gone: the old identity
#     must not come back), add it again with the same name and peer URL, and start as
#     "existing" with the membership etcd returned. Each step is redone from the start if
#     the container restarts midway, so a crash between the two leaves nothing stale.
#   - the data dir is empty, no other member is healthy, but one answers with a raft
#     index past the bootstrap entries: the cluster exists but has no quorum now (another
#     member is down too). Exit 1: the container restarts, and the member rejoins once
#     the cluster is healthy again.
#   - the data dir is empty and no other member is healthy or has served a cluster: the
#     cluster does not exist yet (first install, every member starts at once): "new".
#
# Not handled: a member restarted without quorum answers no client until it has one, so
# during a full restart a member whose data is lost cannot tell the cluster exists and
# starts as "new". etcd refuses that ("already bootstrapped") when the member still has
# its first id, and the container restarts until the cluster is healthy; a member added
# again earlier (a new id) may instead make a log of its own: delete its volume again
# once the others are healthy. A majority of members losing their data at once is a
# restore from backup (docs/deploy.md, "Backup and restore").
#
# It needs only a POSIX shell's builtins, sleep, etcdctl and etcd on PATH (the etcd image
# has no shell: the StatefulSet runs this with a static busybox that an init container
# copies into a shared volume).
#
# Settings, from the environment:
#   ETCD_NAME, ETCD_DATA_DIR, ETCD_INITIAL_ADVERTISE_PEER_URLS, ETCD_INITIAL_CLUSTER
#                      as etcd reads them (required)
#   CLUSTER_CLIENT_URLS every member's client URL, comma-separated (required); this
#                      member's own (ETCD_ADVERTISE_CLIENT_URLS) is skipped
#   REJOIN_ADD_ATTEMPTS how many times to try `member add`, 1 s apart (30)
#   ETCDCTL_CACERT, ETCDCTL_CERT, ETCDCTL_KEY
#                      the TLS files etcdctl presents, when the members serve TLS

set -eu

: "${ETCD_NAME:?}" "${ETCD_DATA_DIR:?}" "${ETCD_INITIAL_ADVERTISE_PEER_URLS:?}"
: "${ETCD_INITIAL_CLUSTER:?}" "${CLUSTER_CLIENT_URLS:?}"

log() {
    echo "etcd-start: $ETCD_NAME: $*" >&2
}

start() {
    log "starting etcd, initial cluster state $1"
    ETCD_INITIAL_CLUSTER_STATE=$1
    export ETCD_INITIAL_CLUSTER_STATE ETCD_INITIAL_CLUSTER
    unset CLUSTER_CLIENT_URLS REJOIN_ADD_ATTEMPTS
    exec etcd
}

ctl() {
    etcdctl --dial-timeout=2s --command-timeout=5s "$@"
}

# Short, so that a first install, when no other member runs yet, starts at once.
probe() {
    etcdctl --dial-timeout=1s --command-timeout=2s "$@"
}

log "looking for the other members"

# etcd counts a data dir as initialised when member/wal holds any file.
for f in "$ETCD_DATA_DIR"/member/wal/*; do
    if [ -e "$f" ]; then
        start "${ETCD_INITIAL_CLUSTER_STATE:-new}"
    fi
done

# The members of a cluster bootstrapped together share its first log entries, one per
# member; the first leader appends one more. So a member whose raft index exceeds the
# number of members belongs to a cluster that has existed.
size=0
rest="$ETCD_INITIAL_CLUSTER,"
while [ -n "$rest" ]; do
    rest=${rest#*,}
    size=$((size + 1))
done

# A member is healthy when a linearizable read succeeds through it: it has a quorum.
live=""
existed=""
rest="$CLUSTER_CLIENT_URLS,"
while [ -n "$rest" ]; do
    url=${rest%%,*}
    rest=${rest#*,}
    if [ -z "$url" ] || [ "$url" = "${ETCD_ADVERTISE_CLIENT_URLS:-}" ]; then
        continue
    fi
    # A member that is down fails the status request after its timeout; one that runs
    # answers it at once, with or without a quorum.
    status=$(probe --endpoints="$url" endpoint status -w fields 2>/dev/null) || continue
    if probe --endpoints="$url" endpoint health >/dev/null 2>&1; then
        live=$url
        break
    fi
    while IFS= read -r line; do
        case $line in
            '"RaftIndex" : '*)
                index=${line#*: }
                if [ "$index" -gt "$size" ]; then
                    existed="$url (raft index $index)"
                fi
                ;;
        esac
    done <<EOF
$status
EOF
done
if [ -z "$live" ] && [ -n "$existed" ]; then
    # Started as "new", this member would make a log of its own that the cluster never
    # accepts. Wait (the container restarts) until the others have a quorum again.
    log "the data dir is empty and no member is healthy, but $existed has served a" \
        "cluster: not starting a new one; retrying once the cluster has a quorum"
    exit 1
fi
if [ -z "$live" ]; then
    log "the data dir is empty and no other member is healthy: a new cluster"
    start new
fi
log "the data dir is empty and $live is healthy: rejoining the cluster"

# `member list` prints one member a line: "id, status, name, peer URLs, client URLs, learner".
# An entry never started has an empty name, so it is found by its peer URL.
members=$(ctl --endpoints="$live" member list)
stale=""
while IFS= read -r line; do
    id=${line%%, *}
    rest=${line#*, }
    rest=${rest#*, }
    name=${rest%%, *}
    rest=${rest#*, }
    peers=${rest%%, *}
    if [ "$peers" = "$ETCD_INITIAL_ADVERTISE_PEER_URLS" ] || [ "$name" = "$ETCD_NAME" ]; then
        stale="$stale $id"
    fi
done <<EOF
$members
EOF
for id in $stale; do
    log "removing the member entry $id, whose data is gone"
    ctl --endpoints="$live" member remove "$id" >&2
done

# etcd refuses to add a member until every member has been connected for 5 s (the
# "unhealthy cluster" error, with its default --strict-reconfig-check): retry for a while.
attempt=1
until added=$(ctl --endpoints="$live" member add "$ETCD_NAME" \
    --peer-urls="$ETCD_INITIAL_ADVERTISE_PEER_URLS"); do
    if [ "$attempt" -ge "${REJOIN_ADD_ATTEMPTS:-30}" ]; then
        log "member add failed $attempt times: giving up (the container restarts)"
        exit 1
    fi
    attempt=$((attempt + 1))
    sleep 1
done
cluster=""
while IFS= read -r line; do
    case $line in
        ETCD_INITIAL_CLUSTER=*)
            cluster=${line#ETCD_INITIAL_CLUSTER=}
            cluster=${cluster#\"}
            cluster=${cluster%\"}
            ;;
    esac
done <<EOF
$added
EOF
if [ -z "$cluster" ]; then
    log "member add printed no ETCD_INITIAL_CLUSTER: $added"
    exit 1
fi
log "added again; the cluster is $cluster"
ETCD_INITIAL_CLUSTER=$cluster
start existing
