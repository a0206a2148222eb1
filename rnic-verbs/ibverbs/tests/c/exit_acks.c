/* A program that exits straight after taking in its peer's last request
 * still has that request acknowledged, as a hardware NIC would have done:
 * nothing is destroyed or closed, the process just returns from main.
 *
 * Two processes, each its own rnic device (127.0.0.202 and .203, or the
 * addresses given), play
 * ib_write_lat's ping-pong: each WRITEs a counter into the other's buffer
 * and spins on its own for the answer, polling its send CQ for the WRITE's
 * completion in between. The answering process (the child) takes in the
 * last WRITE and returns from main without answering it. The requester
 * (the parent) must see that WRITE complete successfully: without the ACK
 * it retransmits to a device that is gone and fails it with
 * IBV_WC_RETRY_EXC_ERR.
 *
 * Usage: exit_acks ROUNDS [REQUESTER ANSWERER]
 *   (prints "last write acknowledged" on success)
 * Built against the installed <infiniband/verbs.h>, run on rnic's library. */
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "FAILED %s:%d: %s\n", __FILE__, __LINE__, #c); exit(1); } } while (0)

/* What each side tells the other through a pipe. */
struct peer {
	uint32_t qpn;
	uint32_t rkey;
	uint64_t addr;
	union ibv_gid gid;
};

struct side {
	struct ibv_context *ctx;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	volatile uint64_t *buf; /* [0]: where the peer writes; [1]: what we send */
};

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static void open_side(struct side *s, const char *devices)
{
	/* Each process its own device, at its own address. */
	setenv("RNIC_DEVICES", devices, 1);
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n >= 1);
	s->ctx = ibv_open_device(list[0]);
	CHECK(s->ctx);
	ibv_free_device_list(list);
	struct ibv_pd *pd = ibv_alloc_pd(s->ctx);
	CHECK(pd);
	s->cq = ibv_create_cq(s->ctx, 16, NULL, NULL, 0);
	CHECK(s->cq);
	s->buf = aligned_alloc(64, 64);
	CHECK(s->buf);
	memset((void *)s->buf, 0, 64);
	s->mr = ibv_reg_mr(pd, (void *)s->buf, 64, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	CHECK(s->mr);
	struct ibv_qp_init_attr ia = {
		.send_cq = s->cq, .recv_cq = s->cq,
		.cap = { .max_send_wr = 16, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	s->qp = ibv_create_qp(pd, &ia);
	CHECK(s->qp);
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE };
	CHECK(ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
			    IBV_QP_ACCESS_FLAGS) == 0);
}

static struct peer me(struct side *s)
{
	struct peer p = { .qpn = s->qp->qp_num, .rkey = s->mr->rkey, .addr = (uintptr_t)s->buf };
	CHECK(ibv_query_gid(s->ctx, 1, 0, &p.gid) == 0);
	return p;
}

/* Connect to `p`: ACK timeout 14 (67 ms), one retry, so a lost ACK fails
 * the WRITE in well under a second. */
static void connect_to(struct side *s, const struct peer *p)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = p->qpn,
		.rq_psn = 0, .max_dest_rd_atomic = 1, .min_rnr_timer = 12,
		.ah_attr = { .is_global = 1, .port_num = 1,
			     .grh = { .dgid = p->gid, .hop_limit = 64 } },
	};
	CHECK(ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
			    IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
			    IBV_QP_MIN_RNR_TIMER) == 0);
	struct ibv_qp_attr r = { .qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 1,
		.rnr_retry = 7, .sq_psn = 0, .max_rd_atomic = 1 };
	CHECK(ibv_modify_qp(s->qp, &r, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			    IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) == 0);
}

/* WRITE `value` into the peer's word 0 (signaled) and wait for its
 * completion (bounded: 10 s); its status. */
static enum ibv_wc_status write_value(struct side *s, const struct peer *p, uint64_t value)
{
	s->buf[1] = value;
	struct ibv_sge sge = { .addr = (uintptr_t)&s->buf[1], .length = 8, .lkey = s->mr->lkey };
	struct ibv_send_wr w = { .wr_id = value, .sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = p->addr, .rkey = p->rkey } }, *bad;
	CHECK(ibv_post_send(s->qp, &w, &bad) == 0);
	double until = now() + 10;
	struct ibv_wc wc;
	int n;
	while ((n = ibv_poll_cq(s->cq, 1, &wc)) == 0)
		CHECK(now() < until);
	CHECK(n == 1 && wc.wr_id == value);
	return wc.status;
}

/* Spin on word 0 until the peer wrote `value` there (bounded: 10 s). */
static void await_value(struct side *s, uint64_t value)
{
	double until = now() + 10;
	while (s->buf[0] != value)
		CHECK(now() < until);
}

int main(int argc, char **argv)
{
	CHECK(argc == 2 || argc == 4);
	long rounds = atol(argv[1]);
	/* Each test that runs this its own pair of addresses: tests run at
	 * once, and one address is one device. */
	char requester[64], answerer[64];
	snprintf(requester, sizeof requester, "rnic0=%s", argc == 4 ? argv[2] : "127.0.0.202");
	snprintf(answerer, sizeof answerer, "rnic0=%s", argc == 4 ? argv[3] : "127.0.0.203");
	CHECK(rounds >= 1);
	int up[2], down[2];
	CHECK(pipe(up) == 0 && pipe(down) == 0);
	pid_t child = fork();
	CHECK(child >= 0);
	struct side s;
	struct peer p;
	if (child == 0) {
		/* The answering side: answers every WRITE but the last. */
		open_side(&s, answerer);
		struct peer m = me(&s);
		CHECK(write(up[1], &m, sizeof m) == sizeof m);
		CHECK(read(down[0], &p, sizeof p) == sizeof p);
		connect_to(&s, &p);
		for (long i = 1; i < rounds; i++) {
			await_value(&s, i);
			CHECK(write_value(&s, &p, i) == IBV_WC_SUCCESS);
		}
		await_value(&s, rounds);
		/* Gone, nothing destroyed: the kernel's clean-up is all a
		 * program that exits gets. */
		return 0;
	}
	open_side(&s, requester);
	struct peer m = me(&s);
	CHECK(read(up[0], &p, sizeof p) == sizeof p);
	connect_to(&s, &p);
	CHECK(write(down[1], &m, sizeof m) == sizeof m);
	for (long i = 1; i < rounds; i++) {
		CHECK(write_value(&s, &p, i) == IBV_WC_SUCCESS);
		await_value(&s, i);
	}
	enum ibv_wc_status last = write_value(&s, &p, rounds);
	int status;
	CHECK(waitpid(child, &status, 0) == child);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	if (last != IBV_WC_SUCCESS) {
		fprintf(stderr, "FAILED: the last WRITE completed with %s\n", ibv_wc_status_str(last));
		return 1;
	}
	printf("last write acknowledged after %ld round trips\n", rounds);
	return 0;
}
