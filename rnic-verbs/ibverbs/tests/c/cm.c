/* rdma_cm as a C program sees it through rnic's librdmacm.so.1, one process
 * connecting to itself (a listener and an active id on rnic0):
 *   - private data both ways: the REQ's reaches CONNECT_REQUEST after the
 *     rdma_cm header, the REP's reaches ESTABLISHED on the active side;
 *   - rdma_reject with private data: REJECTED with status 28 and the data;
 *   - a port nobody listens on: REJECTED with status 8;
 *   - an address no NIC holds: ADDR_ERROR;
 *   - the event channel is a descriptor: poll() finds it readable exactly
 *     while an event waits, and non-blocking it fails with EAGAIN;
 *   - both sides get DISCONNECTED;
 *   - a synchronous id (no channel) that resolved an address moves to a
 *     channel with rdma_migrate_id (the event it holds is let go);
 *   - 127.0.0.1, which no NIC holds here, binds to no device, and a
 *     listener there hears requests to rnic0's address (the kernel's
 *     rdma_cm has it so; libfabric listens on "localhost");
 *   - 100 connections opened and closed leave no descriptor behind.
 * Built against the installed <rdma/rdma_cma.h>, run on rnic's library. */
#include <rdma/rdma_cma.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "FAILED %s:%d: %s (errno %d)\n", __FILE__, __LINE__, #c, errno); exit(1); } } while (0)
#define CHECK_EQ(a, b) do { long long _a = (long long)(a), _b = (long long)(b); if (_a != _b) { \
	fprintf(stderr, "FAILED %s:%d: %s == %s (%lld != %lld)\n", __FILE__, __LINE__, #a, #b, _a, _b); exit(1); } } while (0)

static struct rdma_event_channel *ch;
static struct sockaddr_in at;

/* The next event, which must be `type`; acknowledged by the caller. */
static struct rdma_cm_event *expect(enum rdma_cm_event_type type)
{
	struct rdma_cm_event *e;
	CHECK_EQ(rdma_get_cm_event(ch, &e), 0);
	if (e->event != type) {
		fprintf(stderr, "FAILED: %s (status %d), expected %s\n", rdma_event_str(e->event),
			e->status, rdma_event_str(type));
		exit(1);
	}
	return e;
}

/* An active id resolved to `to` (address and route). */
static struct rdma_cm_id *resolved(struct sockaddr_in *to)
{
	struct rdma_cm_id *id;
	CHECK_EQ(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP), 0);
	CHECK_EQ(rdma_resolve_addr(id, NULL, (struct sockaddr *)to, 2000), 0);
	rdma_ack_cm_event(expect(RDMA_CM_EVENT_ADDR_RESOLVED));
	CHECK_EQ(rdma_resolve_route(id, 2000), 0);
	rdma_ack_cm_event(expect(RDMA_CM_EVENT_ROUTE_RESOLVED));
	return id;
}

static void make_qp(struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr qa = {
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	CHECK_EQ(rdma_create_qp(id, NULL, &qa), 0);
	CHECK(id->qp && id->send_cq && id->recv_cq);
}

/* An active id with a QP, its connect request sent to rnic0's address at
 * `port`. */
static struct rdma_cm_id *connecting(unsigned short port, struct rdma_conn_param *p)
{
	struct sockaddr_in to = at;
	to.sin_port = htons(port);
	struct rdma_cm_id *id = resolved(&to);
	make_qp(id);
	CHECK_EQ(rdma_connect(id, p), 0);
	return id;
}

static int open_fds(void)
{
	int n = 0;
	DIR *d = opendir("/proc/self/fd");
	CHECK(d);
	while (readdir(d))
		n++;
	closedir(d);
	return n;
}

/* Connect an active id to the listener and accept it; both established. */
static void connect_accept(struct rdma_cm_id **act, struct rdma_cm_id **pas, int check_data)
{
	struct rdma_conn_param p = { .private_data = "hello", .private_data_len = 5,
		.responder_resources = 1, .initiator_depth = 1, .retry_count = 7, .rnr_retry_count = 7 };
	*act = connecting(ntohs(at.sin_port), &p);
	struct rdma_cm_event *e = expect(RDMA_CM_EVENT_CONNECT_REQUEST);
	*pas = e->id;
	if (check_data) {
		CHECK(e->param.conn.private_data_len >= 5);
		CHECK(!memcmp(e->param.conn.private_data, "hello", 5));
		CHECK_EQ(e->param.conn.initiator_depth, 1);
		CHECK_EQ(e->param.conn.qp_num, (*act)->qp->qp_num);
		CHECK_EQ(ntohs(rdma_get_dst_port(*pas)), ntohs(rdma_get_src_port(*act)));
	}
	rdma_ack_cm_event(e);
	make_qp(*pas);
	struct rdma_conn_param r = { .private_data = "welcome", .private_data_len = 7,
		.responder_resources = 1, .initiator_depth = 1, .rnr_retry_count = 7 };
	CHECK_EQ(rdma_accept(*pas, &r), 0);
	/* Both ESTABLISHED, in whichever order. */
	for (int k = 0; k < 2; k++) {
		e = expect(RDMA_CM_EVENT_ESTABLISHED);
		CHECK(e->id == *act || e->id == *pas);
		if (check_data && e->id == *act) {
			CHECK(e->param.conn.private_data_len >= 7);
			CHECK(!memcmp(e->param.conn.private_data, "welcome", 7));
		}
		rdma_ack_cm_event(e);
	}
}

/* Disconnect from the active side: both get DISCONNECTED; all destroyed. */
static void disconnect_destroy(struct rdma_cm_id *act, struct rdma_cm_id *pas)
{
	CHECK_EQ(rdma_disconnect(act), 0);
	for (int k = 0; k < 2; k++) {
		struct rdma_cm_event *e = expect(RDMA_CM_EVENT_DISCONNECTED);
		CHECK(e->id == act || e->id == pas);
		rdma_ack_cm_event(e);
	}
	/* The passive side's own disconnect, after the peer's: nothing to do. */
	CHECK_EQ(rdma_disconnect(pas), 0);
	rdma_destroy_qp(act);
	rdma_destroy_qp(pas);
	CHECK_EQ(rdma_destroy_id(act), 0);
	CHECK_EQ(rdma_destroy_id(pas), 0);
}

int main(void)
{
	alarm(20); /* a call that never returns fails the test */
	struct ibv_context **devs = rdma_get_devices(NULL);
	CHECK(devs && devs[0]);
	union ibv_gid gid;
	CHECK_EQ(ibv_query_gid(devs[0], 1, 0, &gid), 0);
	rdma_free_devices(devs);
	ch = rdma_create_event_channel();
	CHECK(ch);

	/* The listener, on rnic0's address (the IPv4 in its GID). */
	struct rdma_cm_id *listener;
	CHECK_EQ(rdma_create_id(ch, &listener, NULL, RDMA_PS_TCP), 0);
	memset(&at, 0, sizeof at);
	at.sin_family = AF_INET;
	memcpy(&at.sin_addr, &gid.raw[12], 4);
	at.sin_port = htons(20886);
	CHECK_EQ(rdma_bind_addr(listener, (struct sockaddr *)&at), 0);
	CHECK_EQ(rdma_listen(listener, 8), 0);
	CHECK(listener->verbs);
	/* The port is the listener's, for any other id of any process. */
	struct rdma_cm_id *again;
	CHECK_EQ(rdma_create_id(ch, &again, NULL, RDMA_PS_TCP), 0);
	CHECK_EQ(rdma_bind_addr(again, (struct sockaddr *)&at), -1);
	CHECK_EQ(errno, EADDRINUSE);
	CHECK_EQ(rdma_destroy_id(again), 0);

	/* The channel's descriptor: readable while an event waits, EAGAIN
	 * when non-blocking and empty. */
	struct pollfd pfd = { .fd = ch->fd, .events = POLLIN };
	CHECK_EQ(poll(&pfd, 1, 0), 0);
	int fl = fcntl(ch->fd, F_GETFL);
	CHECK_EQ(fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK), 0);
	struct rdma_cm_event *e;
	CHECK_EQ(rdma_get_cm_event(ch, &e), -1);
	CHECK_EQ(errno, EAGAIN);
	CHECK_EQ(fcntl(ch->fd, F_SETFL, fl), 0);

	/* Private data both ways, then both sides disconnected. */
	struct rdma_cm_id *act, *pas;
	connect_accept(&act, &pas, 1);
	disconnect_destroy(act, pas);

	/* rdma_reject with private data. */
	struct rdma_conn_param p = { .responder_resources = 1, .initiator_depth = 1,
		.retry_count = 7, .rnr_retry_count = 7 };
	act = connecting(ntohs(at.sin_port), &p);
	CHECK_EQ(poll(&pfd, 1, 5000), 1);
	e = expect(RDMA_CM_EVENT_CONNECT_REQUEST);
	pas = e->id;
	rdma_ack_cm_event(e);
	CHECK_EQ(poll(&pfd, 1, 0), 0);
	CHECK_EQ(rdma_reject(pas, "go away", 7), 0);
	e = expect(RDMA_CM_EVENT_REJECTED);
	CHECK(e->id == act);
	CHECK_EQ(e->status, 28);
	CHECK(e->param.conn.private_data_len >= 7);
	CHECK(!memcmp(e->param.conn.private_data, "go away", 7));
	rdma_ack_cm_event(e);
	rdma_destroy_qp(act);
	CHECK_EQ(rdma_destroy_id(act), 0);
	CHECK_EQ(rdma_destroy_id(pas), 0);

	/* A port nobody listens on. */
	act = connecting(20887, &p);
	e = expect(RDMA_CM_EVENT_REJECTED);
	CHECK_EQ(e->status, 8);
	rdma_ack_cm_event(e);
	rdma_destroy_qp(act);
	CHECK_EQ(rdma_destroy_id(act), 0);

	/* An address no NIC holds. */
	struct sockaddr_in none = at;
	inet_pton(AF_INET, "127.0.0.223", &none.sin_addr);
	CHECK_EQ(rdma_create_id(ch, &act, NULL, RDMA_PS_TCP), 0);
	CHECK_EQ(rdma_resolve_addr(act, NULL, (struct sockaddr *)&none, 2000), 0);
	e = expect(RDMA_CM_EVENT_ADDR_ERROR);
	CHECK(e->status != 0);
	rdma_ack_cm_event(e);
	CHECK_EQ(rdma_destroy_id(act), 0);

	/* A synchronous id, resolved, moved to the channel. */
	struct rdma_cm_id *sync_id;
	CHECK_EQ(rdma_create_id(NULL, &sync_id, NULL, RDMA_PS_TCP), 0);
	CHECK_EQ(rdma_resolve_addr(sync_id, NULL, (struct sockaddr *)&at, 2000), 0);
	CHECK_EQ(rdma_migrate_id(sync_id, ch), 0);
	CHECK(sync_id->channel == ch);
	CHECK_EQ(rdma_destroy_id(sync_id), 0);

	/* A listener on 127.0.0.1: no device, every device's addresses. */
	struct sockaddr_in lo = at;
	inet_pton(AF_INET, "127.0.0.1", &lo.sin_addr);
	lo.sin_port = htons(20888);
	struct rdma_cm_id *lo_listener;
	CHECK_EQ(rdma_create_id(ch, &lo_listener, NULL, RDMA_PS_TCP), 0);
	CHECK_EQ(rdma_bind_addr(lo_listener, (struct sockaddr *)&lo), 0);
	CHECK(!lo_listener->verbs);
	CHECK_EQ(rdma_listen(lo_listener, 8), 0);
	act = connecting(20888, &p);
	e = expect(RDMA_CM_EVENT_CONNECT_REQUEST);
	CHECK(e->listen_id == lo_listener);
	pas = e->id;
	rdma_ack_cm_event(e);
	CHECK_EQ(rdma_reject(pas, NULL, 0), 0);
	e = expect(RDMA_CM_EVENT_REJECTED);
	rdma_ack_cm_event(e);
	rdma_destroy_qp(act);
	CHECK_EQ(rdma_destroy_id(act), 0);
	CHECK_EQ(rdma_destroy_id(pas), 0);
	CHECK_EQ(rdma_destroy_id(lo_listener), 0);

	/* 100 connections opened and closed: no descriptor left behind. */
	connect_accept(&act, &pas, 0);
	disconnect_destroy(act, pas);
	int before = open_fds();
	for (int k = 0; k < 100; k++) {
		connect_accept(&act, &pas, 0);
		disconnect_destroy(act, pas);
	}
	if (open_fds() != before) {
		char cmd[64];
		snprintf(cmd, sizeof cmd, "ss -uaxpn | grep pid=%d, | tail -4", getpid());
		if (system(cmd)) {}
	}
	CHECK_EQ(open_fds(), before);

	CHECK_EQ(rdma_destroy_id(listener), 0);
	rdma_destroy_event_channel(ch);
	printf("rdma_cm as expected\n");
	return 0;
}
