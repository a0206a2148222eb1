# Sourced by the guest scripts (busybox sh): two rdma_rxe devices, rxe0 on
# va (10.77.0.1) and rxe1 on vb (10.77.0.2), the two ends of a veth pair;
# sets $gid to their IPv4-mapped RoCE v2 GID index, or returns 2.
#
# rdma_rxe (Linux 6.1) works only in the initial network namespace, so both
# devices live there; policy routing sends what one address sends to the
# other over the veth instead of the loopback device.
rxe_pair() {
    sysctl -w net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
    $ip link add va type veth peer name vb
    $ip link set va address 02:00:00:00:00:0a
    $ip link set vb address 02:00:00:00:00:0b
    $ip addr add 10.77.0.1/24 dev va
    $ip addr add 10.77.0.2/24 dev vb
    $ip link set va up
    $ip link set vb up
    for i in all default va vb; do
        sysctl -w net.ipv4.conf.$i.accept_local=1 net.ipv4.conf.$i.rp_filter=0
    done
    $ip rule add pref 100 to 10.77.0.2 iif lo lookup 100
    $ip rule add pref 101 to 10.77.0.1 iif lo lookup 101
    $ip route add 10.77.0.2 dev va src 10.77.0.1 table 100
    $ip route add 10.77.0.1 dev vb src 10.77.0.2 table 101
    $ip rule add pref 1000 lookup local
    $ip rule del pref 0 lookup local
    $ip neigh replace 10.77.0.2 lladdr 02:00:00:00:00:0b dev va nud permanent
    $ip neigh replace 10.77.0.1 lladdr 02:00:00:00:00:0a dev vb nud permanent
    rdma link add rxe0 type rxe netdev va || return 2
    rdma link add rxe1 type rxe netdev vb || return 2
    ibv_devices
    # The IPv4-mapped RoCE v2 GID (index 1 on rxe; 0 is the IPv6 link-local).
    gid=$(for g in /sys/class/infiniband/rxe0/ports/1/gids/*; do
        case "$(cat "$g")" in 0000:0000:0000:0000:0000:ffff:*) echo "${g##*/}"; break ;; esac
    done)
    [ -n "$gid" ] || return 2
}
