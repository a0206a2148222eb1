# Sourced by interop/rxe-interop (bash) and the guest's interop.sh (busybox
# sh): the cases whose programs connect through rdma_cm, the command line
# of each side, and whether a side's server is listening yet.

# cm_case PROG ARGS...: whether the run connects through rdma_cm: librdmacm's
# examples, and perftest with -R.
cm_case() {
    case "$1" in rping | ucmatose | udaddy | rdma_server | refused) return 0 ;; esac
    shift
    case " $* " in *" -R "*) return 0 ;; esac
    return 1
}

# cm_cmd ROLE SELF PEER PORT PROG ARGS...: the command line of the server
# (ROLE server, listening on SELF) or of the client (ROLE client, on SELF,
# connecting to PEER). udaddy has no port option: it is always on 7174.
# "refused" is an rping client with no server: see cm_refused.
cm_cmd() {
    _role=$1 _self=$2 _peer=$3 _port=$4 _prog=$5
    shift 5
    case "$_prog.$_role" in
    rping.server) echo "rping -s -a $_self -p $_port $*" ;;
    rping.client) echo "rping -c -a $_peer -I $_self -p $_port $*" ;;
    ucmatose.server) echo "ucmatose -b $_self -p $_port $*" ;;
    ucmatose.client) echo "ucmatose -s $_peer -b $_self -p $_port $*" ;;
    udaddy.server) echo "udaddy -b $_self $*" ;;
    udaddy.client) echo "udaddy -s $_peer -b $_self $*" ;;
    refused.client) echo "rping -c -a $_peer -I $_self -p $_port -C 1" ;;
    rdma_server.server) echo "rdma_server -s $_self -p $_port $*" ;;
    rdma_server.client) echo "rdma_client -s $_peer -p $_port $*" ;;
    *.server) echo "$_prog $* -p $_port" ;;
    *.client) echo "$_prog $* -p $_port $_peer" ;;
    esac
}

# cm_port PROG PORT: the port PROG's server listens on.
cm_port() {
    case "$1" in udaddy) echo 7174 ;; *) echo "$2" ;; esac
}

# cm_refused OUTPUT: whether a "refused" run ended as it must: the REQ to a
# port nobody listens on answered with REJ, reason 8 (invalid service ID),
# which rping reports as the event's status.
cm_refused() {
    grep -q "RDMA_CM_EVENT_REJECTED, error 8" "$1"
}
