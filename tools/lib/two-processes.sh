# Shared by the scripts that run a server and a client as two processes.

# Whether something listens on TCP port $1 (read from /proc: probing with a
# connection would use up the server's one accept).
listening() {
    local hex
    hex=$(printf '%04X' "$1")
    awk -v p=":$hex" '$4 == "0A" && substr($2, length($2) - 4) == p { found = 1 } END { exit !found }' \
        /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

# Wait (up to 10 s) until TCP port $1 listens or process $2 is gone.
wait_listening() {
    local i
    for i in $(seq 1 100); do
        listening "$1" && return 0
        kill -0 "$2" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}

# The pattern of the route name a process of rnic's holds while it listens
# on rdma_cm port $1 (of any port space): the name is on record in
# /proc/net/unix, and carries the service ID, (port space << 16) + port.
cm_route() { echo "@rnic/cm-route/.*/0000000001[0-9a-f]{2}$(printf %04x "$1")/"; }
