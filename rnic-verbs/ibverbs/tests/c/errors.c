/* Error paths through the drop-in libibverbs, seen as a C program sees them:
 * two RC QPs on one rnic device, connected to each other.
 *   - a WRITE with a wrong rkey completes with IBV_WC_REM_ACCESS_ERR;
 *   - a SEND with no receive posted, rnr_retry 0: IBV_WC_RNR_RETRY_EXC_ERR;
 *   - a post with an unknown opcode fails with EINVAL and sets bad_wr;
 *   - an armed SRQ raises IBV_EVENT_SRQ_LIMIT_REACHED through
 *     ibv_get_async_event, and async_fd is readable first.
 * Built against the installed <infiniband/verbs.h>, run on rnic's library. */
#include <infiniband/verbs.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "FAILED %s:%d: %s\n", __FILE__, __LINE__, #c); exit(1); } } while (0)

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static union ibv_gid gid;

static struct ibv_qp *make_qp(struct ibv_srq *srq)
{
	struct ibv_qp_init_attr ia = {
		.send_cq = cq, .recv_cq = cq, .srq = srq,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	CHECK(qp);
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ };
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0);
	return qp;
}

static void connect_qp(struct ibv_qp *qp, uint32_t dest, int rnr_retry)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = dest,
		.rq_psn = 0, .max_dest_rd_atomic = 1, .min_rnr_timer = 1,
		.ah_attr = { .is_global = 1, .port_num = 1, .grh = { .dgid = gid, .hop_limit = 64 } },
	};
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			    IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) == 0);
	struct ibv_qp_attr r = { .qp_state = IBV_QPS_RTS, .timeout = 8, .retry_cnt = 1,
		.rnr_retry = rnr_retry, .sq_psn = 0, .max_rd_atomic = 1 };
	CHECK(ibv_modify_qp(qp, &r, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			    IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) == 0);
}

static struct ibv_wc wait_wc(uint64_t wr_id)
{
	struct ibv_wc wc;
	for (long i = 0; i < 2000000000L; i++) {
		int n = ibv_poll_cq(cq, 1, &wc);
		CHECK(n >= 0);
		if (n == 1 && wc.wr_id == wr_id)
			return wc;
	}
	fprintf(stderr, "no completion for %lu\n", (unsigned long)wr_id);
	exit(1);
}

int main(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	CHECK(list && list[0]);
	ctx = ibv_open_device(list[0]);
	CHECK(ctx);
	CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0);
	pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	CHECK(pd && cq);
	char *buf = calloc(1, 4096);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	CHECK(mr);

	/* A wrong rkey: the responder NAKs, the requester reports REM_ACCESS_ERR. */
	struct ibv_qp *a = make_qp(NULL), *b = make_qp(NULL);
	connect_qp(a, b->qp_num, 7);
	connect_qp(b, a->qp_num, 7);
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 64, .lkey = mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = (uintptr_t)buf + 2048, .rkey = mr->rkey ^ 0x5500 } }, *bad;
	CHECK(ibv_post_send(a, &wr, &bad) == 0);
	struct ibv_wc wc = wait_wc(1);
	CHECK(wc.status == IBV_WC_REM_ACCESS_ERR);
	printf("bad rkey: %s\n", ibv_wc_status_str(wc.status));

	/* An unknown opcode: EINVAL, and bad_wr names the request. */
	struct ibv_qp *c = make_qp(NULL), *d = make_qp(NULL);
	connect_qp(c, d->qp_num, 0);
	connect_qp(d, c->qp_num, 0);
	struct ibv_send_wr ok = { .wr_id = 2, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND };
	struct ibv_send_wr junk = ok;
	junk.wr_id = 3;
	junk.opcode = 77;
	ok.next = &junk;
	bad = NULL;
	CHECK(ibv_post_send(c, &ok, &bad) == EINVAL);
	CHECK(bad == &junk);
	printf("bad opcode: EINVAL, bad_wr set\n");

	/* No receive posted and rnr_retry 0: the SEND of wr 2, unsignaled but
	 * failed, completes with RNR_RETRY_EXC_ERR (errors always complete). */
	wc = wait_wc(2);
	CHECK(wc.status == IBV_WC_RNR_RETRY_EXC_ERR);
	printf("no receive: %s\n", ibv_wc_status_str(wc.status));
	struct ibv_send_wr send = { .wr_id = 4, .sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED };

	/* SRQ limit: arm at 2 with 2 receives posted; one consumed -> event. */
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 8, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_srq(pd, &sa);
	CHECK(srq);
	for (int i = 0; i < 2; i++) {
		struct ibv_recv_wr rw = { .wr_id = 100 + i, .sg_list = &sge, .num_sge = 1 }, *rb;
		CHECK(ibv_post_srq_recv(srq, &rw, &rb) == 0);
	}
	struct ibv_srq_attr lim = { .srq_limit = 2 };
	CHECK(ibv_modify_srq(srq, &lim, IBV_SRQ_LIMIT) == 0);
	struct ibv_qp *e = make_qp(NULL), *f = make_qp(srq);
	connect_qp(e, f->qp_num, 7);
	connect_qp(f, e->qp_num, 7);
	send.wr_id = 5;
	CHECK(ibv_post_send(e, &send, &bad) == 0);
	struct pollfd pfd = { .fd = ctx->async_fd, .events = POLLIN };
	CHECK(poll(&pfd, 1, 10000) == 1);
	struct ibv_async_event ev;
	CHECK(ibv_get_async_event(ctx, &ev) == 0);
	CHECK(ev.event_type == IBV_EVENT_SRQ_LIMIT_REACHED && ev.element.srq == srq);
	ibv_ack_async_event(&ev);
	printf("srq limit: %s\n", ibv_event_type_str(ev.event_type));

	CHECK(ibv_destroy_qp(a) == 0 && ibv_destroy_qp(b) == 0);
	CHECK(ibv_destroy_qp(c) == 0 && ibv_destroy_qp(d) == 0);
	CHECK(ibv_destroy_qp(e) == 0 && ibv_destroy_qp(f) == 0);
	CHECK(ibv_destroy_srq(srq) == 0);
	CHECK(ibv_dereg_mr(mr) == 0);
	CHECK(ibv_destroy_cq(cq) == 0);
	CHECK(ibv_dealloc_pd(pd) == 0);
	CHECK(ibv_close_device(ctx) == 0);
	ibv_free_device_list(list);
	free(buf);
	printf("all error paths as expected\n");
	return 0;
}
