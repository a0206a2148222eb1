/* What a C program reads in each field of a completion, per work request
 * type and transport, and the blocking calls' behaviour under signals: the
 * fields verbs leaves open follow rdma_rxe and mlx5, so that programs tuned
 * on either see the same here (docs/drop-in.md, "Completions", lists every
 * choice and its source).
 *   - send side: byte_len is the message length on success (8 for
 *     CMP_AND_SWP and FETCH_ADD), IBV_WC_WITH_IMM for SEND_WITH_IMM and
 *     RDMA_WRITE_WITH_IMM; an error completion has neither;
 *   - receive side: byte_len the bytes placed (40 more on UD: the network
 *     header), RECV_RDMA_WITH_IMM carrying the WRITE's length, IBV_WC_GRH
 *     and wc.sl the RoCE packet type on UD (mlx5's encoding), src_qp;
 *   - RC, UC and UD; a receive too small (IBV_WC_LOC_LEN_ERR, the IBTA's;
 *     the sender's IBV_WC_REM_OP_ERR, rdma_rxe's NAK),
 *     a bad rkey, and the flush behind an error;
 *   - ibv_get_cq_event and ibv_get_async_event end with EINTR when a signal
 *     handler installed without SA_RESTART runs, and wait on with it, as a
 *     read(2) does;
 *   - one node GUID: ibv_get_device_guid before opening equals node_guid of
 *     ibv_query_device after.
 * Built against the installed <infiniband/verbs.h>, run on rnic's library. */
#include <infiniband/verbs.h>
#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "FAILED %s:%d: %s\n", __FILE__, __LINE__, #c); exit(1); } } while (0)
#define CHECK_EQ(a, b) do { long long _a = (long long)(a), _b = (long long)(b); if (_a != _b) { \
	fprintf(stderr, "FAILED %s:%d: %s == %s (%lld != %lld)\n", __FILE__, __LINE__, #a, #b, _a, _b); exit(1); } } while (0)

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static union ibv_gid gid;
static char *buf;
static struct ibv_mr *mr;

enum { SIZE = 1 << 16, MSG = 3000 };

struct pair {
	struct ibv_cq *scq, *rcq; /* the sender's send CQ, the receiver's receive CQ */
	struct ibv_qp *s, *r;
};

static struct ibv_qp *make_qp(enum ibv_qp_type t, struct ibv_cq *scq, struct ibv_cq *rcq)
{
	struct ibv_qp_init_attr ia = {
		.send_cq = scq, .recv_cq = rcq,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = t,
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	CHECK(qp);
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = 0x1234,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC };
	int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
	mask |= t == IBV_QPT_UD ? IBV_QP_QKEY : IBV_QP_ACCESS_FLAGS;
	if (t == IBV_QPT_UC)
		a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
	CHECK(ibv_modify_qp(qp, &a, mask) == 0);
	return qp;
}

static void to_rts(struct ibv_qp *qp, enum ibv_qp_type t, uint32_t dest)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = dest,
		.rq_psn = 0, .max_dest_rd_atomic = 1, .min_rnr_timer = 1,
		.ah_attr = { .is_global = 1, .port_num = 1, .grh = { .dgid = gid, .hop_limit = 64 } },
	};
	int mask = IBV_QP_STATE;
	if (t != IBV_QPT_UD)
		mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
	if (t == IBV_QPT_RC)
		mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
	CHECK(ibv_modify_qp(qp, &a, mask) == 0);
	struct ibv_qp_attr r = { .qp_state = IBV_QPS_RTS, .timeout = 10, .retry_cnt = 1,
		.rnr_retry = 1, .sq_psn = 0, .max_rd_atomic = 1 };
	mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
	if (t == IBV_QPT_RC)
		mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
	CHECK(ibv_modify_qp(qp, &r, mask) == 0);
}

static struct pair make_pair(enum ibv_qp_type t)
{
	struct pair p;
	p.scq = ibv_create_cq(ctx, 32, NULL, NULL, 0);
	p.rcq = ibv_create_cq(ctx, 32, NULL, NULL, 0);
	CHECK(p.scq && p.rcq);
	/* The sender's receives and the receiver's sends go to the other CQ,
	 * so each CQ below holds one side's completions only. */
	p.s = make_qp(t, p.scq, p.rcq);
	p.r = make_qp(t, p.scq, p.rcq);
	to_rts(p.s, t, p.r->qp_num);
	to_rts(p.r, t, p.s->qp_num);
	return p;
}

static struct ibv_wc next_wc(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		int n = ibv_poll_cq(cq, 1, &wc);
		CHECK(n >= 0);
		if (n == 1)
			return wc;
		clock_gettime(CLOCK_MONOTONIC, &t);
		if (t.tv_sec - t0.tv_sec > 20) {
			fprintf(stderr, "no completion in 20 s\n");
			exit(1);
		}
	}
}

static void post_recv(struct ibv_qp *qp, uint64_t id, size_t off, uint32_t len)
{
	struct ibv_sge s = { .addr = (uintptr_t)buf + off, .length = len, .lkey = mr->lkey };
	struct ibv_recv_wr w = { .wr_id = id, .sg_list = &s, .num_sge = 1 }, *bad;
	CHECK(ibv_post_recv(qp, &w, &bad) == 0);
}

static struct ibv_ah *ah;

/* A signaled request on a connected QP (post_ud for datagrams). */
static void post(struct ibv_qp *qp, enum ibv_qp_type t, uint64_t id, enum ibv_wr_opcode op,
		 uint32_t len, uint32_t rkey)
{
	(void)t;
	struct ibv_sge s = { .addr = (uintptr_t)buf, .length = len, .lkey = mr->lkey };
	struct ibv_send_wr w = { .wr_id = id, .sg_list = &s, .num_sge = 1, .opcode = op,
		.send_flags = IBV_SEND_SIGNALED, .imm_data = htonl(0xfeed0000 | (uint32_t)id) }, *bad;
	if (op == IBV_WR_ATOMIC_CMP_AND_SWP || op == IBV_WR_ATOMIC_FETCH_AND_ADD) {
		w.wr.atomic.remote_addr = (uintptr_t)buf + SIZE - 64;
		w.wr.atomic.rkey = rkey;
		w.wr.atomic.compare_add = 1;
	} else {
		w.wr.rdma.remote_addr = (uintptr_t)buf + SIZE / 2;
		w.wr.rdma.rkey = rkey;
	}
	CHECK(ibv_post_send(qp, &w, &bad) == 0);
}

static void post_ud(struct ibv_qp *qp, uint32_t dest, uint64_t id, enum ibv_wr_opcode op, uint32_t len)
{
	struct ibv_sge s = { .addr = (uintptr_t)buf, .length = len, .lkey = mr->lkey };
	struct ibv_send_wr w = { .wr_id = id, .sg_list = &s, .num_sge = 1, .opcode = op,
		.send_flags = IBV_SEND_SIGNALED, .imm_data = htonl(0xfeed0000 | (uint32_t)id),
		.wr.ud = { .ah = ah, .remote_qpn = dest, .remote_qkey = 0x1234 } }, *bad;
	CHECK(ibv_post_send(qp, &w, &bad) == 0);
}

/* The next completion on `cq`, which must be `id`'s with this status,
 * opcode (on success), byte_len and flags; with immediate data, the one the
 * request `id - 100` sent (receives are numbered 100 past their SEND). */
static struct ibv_wc expect(struct ibv_cq *cq, uint64_t id, enum ibv_wc_status st,
			    enum ibv_wc_opcode op, uint32_t len, unsigned flags)
{
	struct ibv_wc wc = next_wc(cq);
	CHECK_EQ(wc.wr_id, id);
	CHECK_EQ(wc.status, st);
	if (st == IBV_WC_SUCCESS)
		CHECK_EQ(wc.opcode, op);
	CHECK_EQ(wc.byte_len, len);
	CHECK_EQ(wc.wc_flags, flags);
	if ((flags & IBV_WC_WITH_IMM) && id > 100)
		CHECK_EQ(ntohl(wc.imm_data), 0xfeed0000 | (uint32_t)(id - 100));
	return wc;
}

/* A send completion: no service level to report. */
static void expect_send(struct ibv_cq *cq, uint64_t id, enum ibv_wc_status st,
			enum ibv_wc_opcode op, uint32_t len, unsigned flags)
{
	CHECK_EQ(expect(cq, id, st, op, len, flags).sl, 0);
}

static void connected(enum ibv_qp_type t)
{
	struct pair p = make_pair(t);
	int rc = t == IBV_QPT_RC;
	post_recv(p.r, 101, 4096, 4096);
	post(p.s, t, 1, IBV_WR_SEND, MSG, 0);
	expect_send(p.scq, 1, IBV_WC_SUCCESS, IBV_WC_SEND, MSG, 0);
	expect(p.rcq, 101, IBV_WC_SUCCESS, IBV_WC_RECV, MSG, 0);

	post_recv(p.r, 102, 4096, 4096);
	post(p.s, t, 2, IBV_WR_SEND_WITH_IMM, MSG, 0);
	expect_send(p.scq, 2, IBV_WC_SUCCESS, IBV_WC_SEND, MSG, IBV_WC_WITH_IMM);
	expect(p.rcq, 102, IBV_WC_SUCCESS, IBV_WC_RECV, MSG, IBV_WC_WITH_IMM);

	post(p.s, t, 3, IBV_WR_RDMA_WRITE, MSG, mr->rkey);
	expect_send(p.scq, 3, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, MSG, 0);

	/* WRITE_WITH_IMM takes a receive, which reports the WRITE's length. */
	post_recv(p.r, 104, 4096, 16);
	post(p.s, t, 4, IBV_WR_RDMA_WRITE_WITH_IMM, MSG, mr->rkey);
	expect_send(p.scq, 4, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, MSG, IBV_WC_WITH_IMM);
	expect(p.rcq, 104, IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM, MSG, IBV_WC_WITH_IMM);

	if (rc) {
		post(p.s, t, 5, IBV_WR_RDMA_READ, MSG, mr->rkey);
		expect_send(p.scq, 5, IBV_WC_SUCCESS, IBV_WC_RDMA_READ, MSG, 0);
		post(p.s, t, 6, IBV_WR_ATOMIC_CMP_AND_SWP, 8, mr->rkey);
		expect_send(p.scq, 6, IBV_WC_SUCCESS, IBV_WC_COMP_SWAP, 8, 0);
		post(p.s, t, 7, IBV_WR_ATOMIC_FETCH_AND_ADD, 8, mr->rkey);
		expect_send(p.scq, 7, IBV_WC_SUCCESS, IBV_WC_FETCH_ADD, 8, 0);
		/* A zero-length WRITE completes with byte_len 0. */
		post(p.s, t, 8, IBV_WR_RDMA_WRITE, 0, mr->rkey);
		expect_send(p.scq, 8, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, 0, 0);
		/* A receive too small: Local Length Error at the receiver (the
		 * IBTA's; rdma_rxe says LOC_QP_OP_ERR), and the NAK rdma_rxe
		 * sends, Remote Operational Error, at the sender; both without
		 * length or flags. */
		post_recv(p.r, 109, 4096, 100);
		post(p.s, t, 9, IBV_WR_SEND_WITH_IMM, MSG, 0);
		expect_send(p.scq, 9, IBV_WC_REM_OP_ERR, 0, 0, 0);
		expect(p.rcq, 109, IBV_WC_LOC_LEN_ERR, 0, 0, 0);
		/* The QP is in error: what is posted next is flushed. */
		post(p.s, t, 10, IBV_WR_RDMA_WRITE, MSG, mr->rkey);
		expect_send(p.scq, 10, IBV_WC_WR_FLUSH_ERR, 0, 0, 0);

		/* A bad rkey: REM_ACCESS_ERR, nothing else reported. */
		struct pair q = make_pair(t);
		post(q.s, t, 11, IBV_WR_RDMA_WRITE_WITH_IMM, MSG, mr->rkey ^ 0x4400);
		expect_send(q.scq, 11, IBV_WC_REM_ACCESS_ERR, 0, 0, 0);
	} else {
		/* UC: a receive too small drops the message silently at the
		 * receiver (a class D error): the sender's completes as sent,
		 * and the receive is still there for the next one. */
		post_recv(p.r, 109, 4096, 100);
		post(p.s, t, 9, IBV_WR_SEND, MSG, 0);
		expect_send(p.scq, 9, IBV_WC_SUCCESS, IBV_WC_SEND, MSG, 0);
		post(p.s, t, 10, IBV_WR_SEND, 64, 0);
		expect_send(p.scq, 10, IBV_WC_SUCCESS, IBV_WC_SEND, 64, 0);
		expect(p.rcq, 109, IBV_WC_SUCCESS, IBV_WC_RECV, 64, 0);
	}
	printf("%s: send and receive completions as rdma_rxe and mlx5 report them\n",
	       rc ? "RC" : "UC");
}

static void datagram(void)
{
	struct pair p = make_pair(IBV_QPT_UD);
	struct ibv_ah_attr aa = { .is_global = 1, .port_num = 1,
		.grh = { .dgid = gid, .hop_limit = 64 } };
	ah = ibv_create_ah(pd, &aa);
	CHECK(ah);
	/* mlx5's wc.sl for a RoCE v2 datagram: the UDP bit (8) and the L3
	 * type, 2 for IPv4, 1 for IPv6. */
	int v4 = IN6_IS_ADDR_V4MAPPED((struct in6_addr *)gid.raw);
	unsigned sl = v4 ? 0x8 | 2 : 0x8 | 1;
	post_recv(p.r, 101, 4096, 4096);
	post_ud(p.s, p.r->qp_num, 1, IBV_WR_SEND, 1000);
	expect_send(p.scq, 1, IBV_WC_SUCCESS, IBV_WC_SEND, 1000, 0);
	struct ibv_wc wc = expect(p.rcq, 101, IBV_WC_SUCCESS, IBV_WC_RECV, 40 + 1000, IBV_WC_GRH);
	CHECK_EQ(wc.sl, sl);
	CHECK_EQ(wc.src_qp, p.s->qp_num);
	/* Where the sl says the header is, the destination is this device's
	 * address: what a program checking a datagram's destination reads. */
	if (v4)
		CHECK(memcmp(buf + 4096 + 20 + 16, gid.raw + 12, 4) == 0);
	else
		CHECK(memcmp(buf + 4096 + 24, gid.raw, 16) == 0);

	post_recv(p.r, 102, 4096, 4096);
	post_ud(p.s, p.r->qp_num, 2, IBV_WR_SEND_WITH_IMM, 500);
	expect_send(p.scq, 2, IBV_WC_SUCCESS, IBV_WC_SEND, 500, IBV_WC_WITH_IMM);
	wc = expect(p.rcq, 102, IBV_WC_SUCCESS, IBV_WC_RECV, 40 + 500,
			 IBV_WC_GRH | IBV_WC_WITH_IMM);
	CHECK_EQ(wc.sl, sl);

	/* The extended CQ reads the same sl. */
	struct ibv_cq_init_attr_ex ca = { .cqe = 8, .wc_flags = IBV_WC_EX_WITH_SL |
		IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_SRC_QP };
	struct ibv_cq_ex *xcq = ibv_create_cq_ex(ctx, &ca);
	CHECK(xcq);
	struct ibv_qp *x = make_qp(IBV_QPT_UD, p.scq, ibv_cq_ex_to_cq(xcq));
	to_rts(x, IBV_QPT_UD, 0);
	post_recv(x, 103, 4096, 4096);
	post_ud(p.s, x->qp_num, 3, IBV_WR_SEND, 100);
	expect_send(p.scq, 3, IBV_WC_SUCCESS, IBV_WC_SEND, 100, 0);
	struct ibv_poll_cq_attr pa = { 0 };
	int r, tries = 0;
	while ((r = ibv_start_poll(xcq, &pa)) == ENOENT && tries++ < 20000000)
		;
	CHECK(r == 0);
	CHECK_EQ(xcq->wr_id, 103);
	CHECK_EQ(ibv_wc_read_sl(xcq), sl);
	CHECK_EQ(ibv_wc_read_byte_len(xcq), 140);
	ibv_end_poll(xcq);
	printf("UD: byte_len with the 40-byte header, IBV_WC_GRH, sl 0x%x (RoCE v2 over IPv%d)\n",
	       sl, v4 ? 4 : 6);
}

static volatile sig_atomic_t alarms;
static void on_alarm(int sig)
{
	(void)sig;
	alarms++;
}

static void set_alarm_handler(int flags)
{
	struct sigaction sa = { .sa_handler = on_alarm, .sa_flags = flags };
	sigemptyset(&sa.sa_mask);
	CHECK(sigaction(SIGALRM, &sa, NULL) == 0);
}

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static struct pair late;
static void *write_later(void *arg)
{
	(void)arg;
	usleep(1500 * 1000);
	post(late.s, IBV_QPT_RC, 42, IBV_WR_RDMA_WRITE, 64, mr->rkey);
	return NULL;
}

static void signals(void)
{
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	CHECK(ch);
	struct ibv_cq *cq = ibv_create_cq(ctx, 8, NULL, ch, 0);
	CHECK(cq);
	CHECK(ibv_req_notify_cq(cq, 0) == 0);
	struct ibv_cq *ev_cq;
	void *ev_ctx;

	/* Without SA_RESTART the alarm ends the wait with EINTR. */
	set_alarm_handler(0);
	alarms = 0;
	double t0 = now();
	alarm(1);
	errno = 0;
	CHECK(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == -1);
	CHECK_EQ(errno, EINTR);
	CHECK(alarms == 1 && now() - t0 < 10);

	/* The same for the asynchronous events. */
	alarm(1);
	struct ibv_async_event ae;
	errno = 0;
	CHECK(ibv_get_async_event(ctx, &ae) == -1);
	CHECK_EQ(errno, EINTR);
	CHECK(alarms == 2);

	/* With SA_RESTART the wait goes on through the alarm, to the event. */
	set_alarm_handler(SA_RESTART);
	late.scq = cq;
	late.rcq = cq;
	late.s = make_qp(IBV_QPT_RC, cq, cq);
	late.r = make_qp(IBV_QPT_RC, cq, cq);
	to_rts(late.s, IBV_QPT_RC, late.r->qp_num);
	to_rts(late.r, IBV_QPT_RC, late.s->qp_num);
	pthread_t th;
	t0 = now();
	alarm(1);
	CHECK(pthread_create(&th, NULL, write_later, NULL) == 0);
	CHECK(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == 0);
	CHECK(ev_cq == cq && alarms == 3 && now() - t0 >= 1.4);
	pthread_join(th, NULL);
	ibv_ack_cq_events(cq, 1);
	CHECK_EQ(next_wc(cq).wr_id, 42);
	signal(SIGALRM, SIG_DFL);
	printf("signals: EINTR without SA_RESTART, the wait goes on with it\n");
}

int main(void)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n >= 1);
	uint64_t listed = ibv_get_device_guid(list[0]);
	ctx = ibv_open_device(list[0]);
	CHECK(ctx);
	struct ibv_device_attr da;
	CHECK(ibv_query_device(ctx, &da) == 0);
	CHECK(listed != 0);
	CHECK_EQ(da.node_guid, listed);
	CHECK_EQ(ibv_get_device_guid(list[0]), listed);
	printf("node GUID: one value, %016llx\n", (unsigned long long)be64toh(listed));
	CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0);
	pd = ibv_alloc_pd(ctx);
	CHECK(pd);
	buf = calloc(1, SIZE);
	mr = ibv_reg_mr(pd, buf, SIZE, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
	CHECK(mr);
	connected(IBV_QPT_RC);
	connected(IBV_QPT_UC);
	datagram();
	signals();
	printf("all completions as expected\n");
	return 0;
}
