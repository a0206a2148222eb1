/* Error paths through the drop-in libibverbs, seen as a C program sees them:
 * two RC QPs on one rnic device, connected to each other.
 *   - a WRITE with a wrong rkey completes with IBV_WC_REM_ACCESS_ERR;
 *   - a SEND with no receive posted, rnr_retry 0: IBV_WC_RNR_RETRY_EXC_ERR;
 *   - a post with an unknown opcode fails with EINVAL and sets bad_wr;
 *   - an armed SRQ raises IBV_EVENT_SRQ_LIMIT_REACHED through
 *     ibv_get_async_event, and async_fd is readable first;
 *   - a peer that is gone (nothing at its address): IBV_WC_RETRY_EXC_ERR;
 *   - completions overrunning an unpolled CQ: IBV_EVENT_CQ_ERR, then
 *     IBV_EVENT_QP_FATAL for the QP completing into it;
 *   - SQD with en_sqd_async_notify: IBV_EVENT_SQ_DRAINED;
 *   - ibv_advise_mr checks every SGE: a wrong lkey or a range past the
 *     region is EINVAL, a good one 0;
 *   - misuse: a pointer that is not rnic's, a PD, region, SRQ or channel
 *     still in use, inline data over 256 bytes, an invalid attribute the mask
 *     names: each refused with rdma-core's errno; an ibv_wr_* batch with
 *     one bad request posts none of its requests; ATOMIC WRITE through
 *     ibv_wr_atomic_write;
 *   - ibv_rereg_mr keeps the keys and changes what they open: rights,
 *     memory, protection domain; rdma-core's input errors, and a refusal
 *     that changes nothing;
 *   - a type 1 window, bound by ibv_bind_mw: open to the domain's QPs, bound
 *     again over another range, never invalidated, closed by length 0;
 *   - a parent domain is its inner domain for what is made in it, and holds
 *     it, as an address handle does; a parent over a parent, a thread domain, unknown bits: refused;
 *   - device memory: allocation within max_dm_size, 4-byte aligned copies
 *     in bounds, a zero-based region an RDMA WRITE lands in, EBUSY while
 *     registered;
 *   - fork: a child's calls on inherited objects fail at once (no hang)
 *     but for device memory, which needs nothing of the parent's engine,
 *     and the parent's QPs carry on, data intact.
 * Built against the installed <infiniband/verbs.h>, run on rnic's library. */
#include <infiniband/verbs.h>
#include <errno.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>
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

static struct ibv_async_event next_event(void)
{
	struct pollfd pfd = { .fd = ctx->async_fd, .events = POLLIN };
	CHECK(poll(&pfd, 1, 10000) == 1);
	struct ibv_async_event ev;
	CHECK(ibv_get_async_event(ctx, &ev) == 0);
	ibv_ack_async_event(&ev);
	return ev;
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

/* The next completion, whatever it is. */
static struct ibv_wc next_wc(void)
{
	struct ibv_wc wc;
	for (long i = 0; i < 2000000000L; i++) {
		int n = ibv_poll_cq(cq, 1, &wc);
		CHECK(n >= 0);
		if (n == 1)
			return wc;
	}
	fprintf(stderr, "no completion\n");
	exit(1);
}

/* One RDMA WRITE of 64 bytes from `from` to `to` (rkey `rkey`) on qp; its
 * completion status. */
static enum ibv_wc_status write64(struct ibv_qp *qp, uint64_t id, void *from, uint32_t lkey,
				  void *to, uint32_t rkey)
{
	struct ibv_sge s = { .addr = (uintptr_t)from, .length = 64, .lkey = lkey };
	struct ibv_send_wr w = { .wr_id = id, .sg_list = &s, .num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = (uintptr_t)to, .rkey = rkey } }, *bad;
	CHECK(ibv_post_send(qp, &w, &bad) == 0);
	return wait_wc(id).status;
}

/* A connected pair of fresh QPs: *p writes to *q. */
static void qp_pair(struct ibv_qp **p, struct ibv_qp **q)
{
	*p = make_qp(NULL);
	*q = make_qp(NULL);
	connect_qp(*p, (*q)->qp_num, 7);
	connect_qp(*q, (*p)->qp_num, 7);
}

static void rereg_paths(void)
{
	char *src = malloc(64), *dst = calloc(1, 4096), *dst2 = calloc(1, 64);
	CHECK(src && dst && dst2);
	memset(src, 0x5A, 64);
	struct ibv_mr *s = ibv_reg_mr(pd, src, 64, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *r = ibv_reg_mr(pd, dst, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	CHECK(s && r);
	uint32_t lkey = r->lkey, rkey = r->rkey;
	struct ibv_qp *p, *q;
	qp_pair(&p, &q);

	/* What rdma-core refuses before asking the device. */
	errno = 0;
	CHECK(ibv_rereg_mr(r, 1 << 5, NULL, NULL, 0, 0) == IBV_REREG_MR_ERR_INPUT && errno == EINVAL);
	CHECK(ibv_rereg_mr(r, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, NULL, 0, 0) == IBV_REREG_MR_ERR_INPUT &&
	      errno == EINVAL);
	CHECK(ibv_rereg_mr(r, IBV_REREG_MR_CHANGE_PD, pd, NULL, 0, IBV_ACCESS_LOCAL_WRITE) ==
		      IBV_REREG_MR_ERR_INPUT && errno == EINVAL);
	/* What the device refuses (remote write needs local write; a domain
	 * that is not one): nothing changes. */
	CHECK(ibv_rereg_mr(r, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, IBV_ACCESS_REMOTE_WRITE) ==
		      IBV_REREG_MR_ERR_CMD && errno == EINVAL);
	CHECK(ibv_rereg_mr(r, IBV_REREG_MR_CHANGE_PD | IBV_REREG_MR_CHANGE_ACCESS, (struct ibv_pd *)src,
			   NULL, 0, IBV_ACCESS_LOCAL_WRITE) == IBV_REREG_MR_ERR_CMD);
	CHECK(write64(p, 20, src, s->lkey, dst + 100, rkey) == IBV_WC_SUCCESS);
	CHECK((unsigned char)dst[100] == 0x5A && (unsigned char)dst[163] == 0x5A);

	/* Rights: local only, and the same rkey is refused. */
	CHECK(ibv_rereg_mr(r, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, IBV_ACCESS_LOCAL_WRITE) == 0);
	CHECK(r->lkey == lkey && r->rkey == rkey && r->pd == pd);
	CHECK(write64(p, 21, src, s->lkey, dst + 200, rkey) == IBV_WC_REM_ACCESS_ERR);
	CHECK(dst[200] == 0);
	CHECK(ibv_destroy_qp(p) == 0 && ibv_destroy_qp(q) == 0);

	/* Memory: the keys open 64 bytes at dst2 now, and dst no more. */
	qp_pair(&p, &q);
	CHECK(ibv_rereg_mr(r, IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_ACCESS, NULL, dst2,
			   64, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE) == 0);
	CHECK(r->addr == dst2 && r->length == 64 && r->rkey == rkey);
	CHECK(write64(p, 22, src, s->lkey, dst2, rkey) == IBV_WC_SUCCESS);
	CHECK((unsigned char)dst2[0] == 0x5A && (unsigned char)dst2[63] == 0x5A);
	CHECK(write64(p, 23, src, s->lkey, dst + 300, rkey) == IBV_WC_REM_ACCESS_ERR);
	CHECK(dst[300] == 0);
	CHECK(ibv_destroy_qp(p) == 0 && ibv_destroy_qp(q) == 0);

	/* Domain: in another PD the region is closed to this PD's QPs, and
	 * that PD is in use until the region moves back. */
	struct ibv_pd *pd2 = ibv_alloc_pd(ctx);
	CHECK(pd2);
	CHECK(ibv_rereg_mr(r, IBV_REREG_MR_CHANGE_PD, pd2, NULL, 0, 0) == 0);
	CHECK(r->pd == pd2 && r->rkey == rkey);
	qp_pair(&p, &q);
	CHECK(write64(p, 24, src, s->lkey, dst2, rkey) == IBV_WC_REM_ACCESS_ERR);
	CHECK(ibv_dealloc_pd(pd2) == EBUSY);
	CHECK(ibv_rereg_mr(r, IBV_REREG_MR_CHANGE_PD, pd, NULL, 0, 0) == 0);
	CHECK(ibv_dealloc_pd(pd2) == 0);
	CHECK(ibv_destroy_qp(p) == 0 && ibv_destroy_qp(q) == 0);
	qp_pair(&p, &q);
	memset(dst2, 0, 64);
	CHECK(write64(p, 25, src, s->lkey, dst2, rkey) == IBV_WC_SUCCESS);
	CHECK((unsigned char)dst2[31] == 0x5A);
	CHECK(ibv_destroy_qp(p) == 0 && ibv_destroy_qp(q) == 0);

	CHECK(ibv_dereg_mr(r) == 0 && ibv_dereg_mr(s) == 0);
	free(src);
	free(dst);
	free(dst2);
	printf("rereg: rights, memory and domain change under the same keys\n");
}

/* The next completion, which must be the bind `id`'s, and its status. */
static enum ibv_wc_status bound(uint64_t id)
{
	struct ibv_wc wc = wait_wc(id);
	CHECK(wc.status != IBV_WC_SUCCESS || wc.opcode == IBV_WC_BIND_MW);
	return wc.status;
}

static void type1_window_paths(void)
{
	char *src = malloc(64), *dst = calloc(1, 256);
	CHECK(src && dst);
	memset(src, 0x3C, 64);
	struct ibv_mr *s = ibv_reg_mr(pd, src, 64, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *r = ibv_reg_mr(pd, dst, 256, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
				      IBV_ACCESS_MW_BIND);
	struct ibv_mw *mw = ibv_alloc_mw(pd, IBV_MW_TYPE_1);
	CHECK(s && r && mw && mw->type == IBV_MW_TYPE_1);
	struct ibv_qp *p, *q, *binder;
	qp_pair(&p, &q);
	binder = make_qp(NULL);
	connect_qp(binder, q->qp_num, 7);

	/* Bound through one QP, it opens [dst, dst+64) to the WRITEs another
	 * QP of the domain (p's peer q) receives. */
	uint32_t before = mw->rkey;
	struct ibv_mw_bind b = { .wr_id = 30, .send_flags = IBV_SEND_SIGNALED,
		.bind_info = { .mr = r, .addr = (uintptr_t)dst, .length = 64,
			       .mw_access_flags = IBV_ACCESS_REMOTE_WRITE } };
	CHECK(ibv_bind_mw(binder, mw, &b) == 0);
	CHECK(mw->rkey != before && (mw->rkey >> 8) == (before >> 8));
	CHECK(bound(30) == IBV_WC_SUCCESS);
	uint32_t k1 = mw->rkey;
	CHECK(write64(p, 31, src, s->lkey, dst, k1) == IBV_WC_SUCCESS);
	CHECK((unsigned char)dst[63] == 0x3C);

	/* Bound again while bound: [dst+128, dst+192) under a new key; the old
	 * key and the old range open nothing. */
	b.wr_id = 32;
	b.bind_info.addr = (uintptr_t)dst + 128;
	CHECK(ibv_bind_mw(binder, mw, &b) == 0 && bound(32) == IBV_WC_SUCCESS);
	uint32_t k2 = mw->rkey;
	CHECK(k2 != k1);
	CHECK(write64(p, 33, src, s->lkey, dst + 128, k2) == IBV_WC_SUCCESS);
	CHECK((unsigned char)dst[191] == 0x3C);
	CHECK(ibv_destroy_qp(p) == 0 && ibv_destroy_qp(q) == 0);
	qp_pair(&p, &q);
	CHECK(write64(p, 34, src, s->lkey, dst + 128, k1) == IBV_WC_REM_ACCESS_ERR);
	CHECK(ibv_destroy_qp(p) == 0 && ibv_destroy_qp(q) == 0);

	/* LOCAL_INV does not close a type 1 window: the request fails, the
	 * window stays open. */
	qp_pair(&p, &q);
	struct ibv_send_wr inv = { .wr_id = 35, .opcode = IBV_WR_LOCAL_INV,
		.send_flags = IBV_SEND_SIGNALED, .invalidate_rkey = k2 }, *bad;
	CHECK(ibv_post_send(p, &inv, &bad) == 0);
	CHECK(wait_wc(35).status != IBV_WC_SUCCESS);
	CHECK(ibv_destroy_qp(p) == 0 && ibv_destroy_qp(q) == 0);
	CHECK(ibv_dereg_mr(r) == EBUSY);

	/* Length 0 closes it (a new key again), and the region can go. */
	struct ibv_mw_bind close = { .wr_id = 36, .send_flags = IBV_SEND_SIGNALED };
	CHECK(ibv_destroy_qp(binder) == 0);
	binder = make_qp(NULL);
	connect_qp(binder, binder->qp_num, 7);
	CHECK(ibv_bind_mw(binder, mw, &close) == 0 && bound(36) == IBV_WC_SUCCESS);
	CHECK(mw->rkey != k2);
	qp_pair(&p, &q);
	CHECK(write64(p, 37, src, s->lkey, dst + 128, mw->rkey) == IBV_WC_REM_ACCESS_ERR);
	CHECK(ibv_destroy_qp(p) == 0 && ibv_destroy_qp(q) == 0 && ibv_destroy_qp(binder) == 0);
	CHECK(ibv_dereg_mr(r) == 0 && ibv_dealloc_mw(mw) == 0 && ibv_dereg_mr(s) == 0);
	free(src);
	free(dst);
	printf("type 1 window: open to the domain, rebound, not invalidated, closed by length 0\n");
}

static void parent_domain_paths(void)
{
	struct ibv_pd *inner = ibv_alloc_pd(ctx);
	CHECK(inner);
	struct ibv_parent_domain_init_attr pa = { .pd = inner };
	struct ibv_pd *parent = ibv_alloc_parent_domain(ctx, &pa);
	CHECK(parent && parent != inner && parent->context == ctx);
	struct ibv_parent_domain_init_attr bad = { .pd = parent };
	errno = 0;
	CHECK(!ibv_alloc_parent_domain(ctx, &bad) && errno == EINVAL);
	bad.pd = inner;
	bad.td = (struct ibv_td *)inner;
	CHECK(!ibv_alloc_parent_domain(ctx, &bad) && errno == EINVAL);
	bad.td = NULL;
	bad.comp_mask = 1 << 7;
	CHECK(!ibv_alloc_parent_domain(ctx, &bad) && errno == EOPNOTSUPP);

	/* QPs and a region made in the parent, a region in the inner domain:
	 * one domain. */
	char *src = malloc(64), *dst = calloc(1, 64);
	CHECK(src && dst);
	memset(src, 0x77, 64);
	struct ibv_mr *s = ibv_reg_mr(parent, src, 64, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *r = ibv_reg_mr(inner, dst, 64, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	CHECK(s && r && s->pd == parent);
	struct ibv_pd *saved = pd;
	struct ibv_qp *p, *q;
	pd = parent;
	qp_pair(&p, &q);
	pd = saved;
	CHECK(p->pd == parent);
	CHECK(write64(p, 40, src, s->lkey, dst, r->rkey) == IBV_WC_SUCCESS);
	CHECK((unsigned char)dst[63] == 0x77);

	/* A CQ for the parent domain; the inner one is not a parent. */
	struct ibv_cq_init_attr_ex ca = { .cqe = 4, .comp_mask = IBV_CQ_INIT_ATTR_MASK_PD,
					  .parent_domain = parent };
	struct ibv_cq_ex *cx = ibv_create_cq_ex(ctx, &ca);
	CHECK(cx);
	ca.parent_domain = inner;
	CHECK(!ibv_create_cq_ex(ctx, &ca) && errno == EINVAL);
	CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(cx)) == 0);

	/* So does an address handle. */
	struct ibv_ah_attr aa = { .is_global = 1, .port_num = 1, .grh = { .dgid = gid, .hop_limit = 64 } };
	struct ibv_ah *ah = ibv_create_ah(inner, &aa);
	CHECK(ah && ah->pd == inner);

	/* The parent holds the inner domain until it goes. */
	CHECK(ibv_destroy_qp(p) == 0 && ibv_destroy_qp(q) == 0);
	CHECK(ibv_dereg_mr(s) == 0 && ibv_dereg_mr(r) == 0);
	CHECK(ibv_dealloc_pd(inner) == EBUSY);
	CHECK(ibv_dealloc_pd(parent) == 0);
	CHECK(ibv_dealloc_pd(inner) == EBUSY);
	CHECK(ibv_destroy_ah(ah) == 0 && ibv_dealloc_pd(inner) == 0);
	free(src);
	free(dst);
	printf("parent domain: one domain with its inner one, and holds it\n");
}

static void device_memory_paths(void)
{
	struct ibv_device_attr_ex ax;
	CHECK(ibv_query_device_ex(ctx, NULL, &ax) == 0 && ax.max_dm_size >= 4096);
	struct ibv_alloc_dm_attr da = { .length = ax.max_dm_size + 1 };
	errno = 0;
	CHECK(!ibv_alloc_dm(ctx, &da) && errno == ENOMEM);
	da.length = 256;
	da.comp_mask = 1;
	CHECK(!ibv_alloc_dm(ctx, &da) && errno == EINVAL);
	da.comp_mask = 0;
	struct ibv_dm *dm = ibv_alloc_dm(ctx, &da);
	CHECK(dm);

	/* Copies: 4-byte aligned offsets and lengths, inside. */
	uint32_t words[4] = { 1, 2, 3, 4 }, back[4] = { 0 };
	CHECK(ibv_memcpy_to_dm(dm, 16, words, 16) == 0);
	CHECK(ibv_memcpy_from_dm(back, dm, 16, 16) == 0 && memcmp(words, back, 16) == 0);
	CHECK(ibv_memcpy_to_dm(dm, 17, words, 4) == EINVAL);
	CHECK(ibv_memcpy_to_dm(dm, 16, words, 6) == EINVAL);
	CHECK(ibv_memcpy_to_dm(dm, 256, words, 4) == EINVAL);
	CHECK(ibv_memcpy_from_dm(back, dm, 252, 8) == EINVAL);

	/* A zero-based region over bytes 128..255: a WRITE to its address 0
	 * lands at byte 128 of the device memory. */
	CHECK(!ibv_reg_dm_mr(pd, dm, 128, 128, IBV_ACCESS_LOCAL_WRITE) && errno == EINVAL);
	CHECK(!ibv_reg_dm_mr(pd, dm, 128, 132, IBV_ACCESS_ZERO_BASED | IBV_ACCESS_LOCAL_WRITE) &&
	      errno == EINVAL);
	struct ibv_mr *r = ibv_reg_dm_mr(pd, dm, 128, 128, IBV_ACCESS_ZERO_BASED |
					 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	CHECK(r && r->length == 128);
	char *src = malloc(64);
	CHECK(src);
	memset(src, 0x6B, 64);
	struct ibv_mr *s = ibv_reg_mr(pd, src, 64, IBV_ACCESS_LOCAL_WRITE);
	CHECK(s);
	struct ibv_qp *p, *q;
	qp_pair(&p, &q);
	CHECK(write64(p, 50, src, s->lkey, NULL, r->rkey) == IBV_WC_SUCCESS);
	unsigned char got[132];
	CHECK(ibv_memcpy_from_dm(got, dm, 124, 132) == 0);
	CHECK(got[3] == 0 && got[4] == 0x6B && got[67] == 0x6B && got[68] == 0);
	CHECK(write64(p, 51, src, s->lkey, (char *)NULL + 96, r->rkey) == IBV_WC_REM_ACCESS_ERR);
	CHECK(ibv_destroy_qp(p) == 0 && ibv_destroy_qp(q) == 0);

	CHECK(ibv_free_dm(dm) == EBUSY);
	CHECK(ibv_dereg_mr(r) == 0 && ibv_dereg_mr(s) == 0);
	CHECK(ibv_free_dm(dm) == 0);
	free(src);
	printf("device memory: bounded, aligned copies, a zero-based region a WRITE lands in\n");
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
	struct ibv_async_event ev = next_event();
	CHECK(ev.event_type == IBV_EVENT_SRQ_LIMIT_REACHED && ev.element.srq == srq);
	printf("srq limit: %s\n", ibv_event_type_str(ev.event_type));

	/* A peer that is gone: nothing answers at 127.0.0.202, so the WRITE
	 * times out (timeout 8: ~1 ms), is retried once, and fails. */
	struct ibv_qp *g = make_qp(NULL);
	union ibv_gid real = gid;
	memset(gid.raw, 0, 16);
	gid.raw[10] = gid.raw[11] = 0xff;
	gid.raw[12] = 127; gid.raw[15] = 202;
	connect_qp(g, 0x123, 7);
	gid = real;
	struct ibv_send_wr lost = { .wr_id = 6, .sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = (uintptr_t)buf, .rkey = mr->rkey } };
	CHECK(ibv_post_send(g, &lost, &bad) == 0);
	wc = wait_wc(6);
	CHECK(wc.status == IBV_WC_RETRY_EXC_ERR);
	printf("peer gone: %s\n", ibv_wc_status_str(wc.status));

	/* A CQ of depth 1 the program does not poll: the second completion
	 * overruns it, though the first is long out of the NIC's own queue
	 * (it waits for the program, and counts). */
	struct ibv_cq *small = ibv_create_cq(ctx, 1, NULL, NULL, 0);
	CHECK(small);
	struct ibv_cq *shared = cq;
	cq = small;
	struct ibv_qp *h = make_qp(NULL);
	cq = shared;
	struct ibv_qp *k = make_qp(NULL);
	connect_qp(h, k->qp_num, 7);
	connect_qp(k, h->qp_num, 7);
	struct ibv_send_wr w2 = { .wr_id = 8, .sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = (uintptr_t)buf + 1024, .rkey = mr->rkey } };
	struct ibv_send_wr w1 = w2;
	w1.wr_id = 7;
	CHECK(ibv_post_send(h, &w1, &bad) == 0);
	usleep(200000);
	CHECK(ibv_post_send(h, &w2, &bad) == 0);
	ev = next_event();
	CHECK(ev.event_type == IBV_EVENT_CQ_ERR && ev.element.cq == small);
	printf("cq overrun: %s\n", ibv_event_type_str(ev.event_type));
	ev = next_event();
	CHECK(ev.event_type == IBV_EVENT_QP_FATAL && ev.element.qp == h);
	printf("its qp: %s\n", ibv_event_type_str(ev.event_type));

	/* SQD, asking to be told: the send queue is empty, so at once. */
	struct ibv_qp *m = make_qp(NULL), *n = make_qp(NULL);
	connect_qp(m, n->qp_num, 7);
	connect_qp(n, m->qp_num, 7);
	struct ibv_qp_attr sqd = { .qp_state = IBV_QPS_SQD, .en_sqd_async_notify = 1 };
	CHECK(ibv_modify_qp(m, &sqd, IBV_QP_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY) == 0);
	ev = next_event();
	CHECK(ev.event_type == IBV_EVENT_SQ_DRAINED && ev.element.qp == m);
	printf("sqd: %s\n", ibv_event_type_str(ev.event_type));

	/* Prefetch advice: nothing to fetch, but the SGEs are checked. */
	struct ibv_sge pre = { .addr = (uintptr_t)buf, .length = 4096, .lkey = mr->lkey };
	CHECK(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, IBV_ADVISE_MR_FLAG_FLUSH, &pre, 1) == 0);
	pre.length = 4097;
	CHECK(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &pre, 1) == EINVAL);
	pre.length = 64;
	pre.lkey ^= 0x100;
	CHECK(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &pre, 1) == EINVAL);
	printf("advise_mr: SGEs checked\n");

	/* Misuse by the program: refused with rdma-core's errno, nothing
	 * touched. A pointer that is not one of rnic's objects: */
	static uint64_t not_ours[512];
	CHECK(ibv_destroy_cq((struct ibv_cq *)not_ours) == EINVAL);
	CHECK(ibv_dealloc_pd((struct ibv_pd *)not_ours) == EINVAL);
	/* A domain still in use: */
	CHECK(ibv_dealloc_pd(pd) == EBUSY);
	/* Inline data: 256 bytes at most, at creation and per post. */
	struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1,
			 .max_inline_data = 257 } };
	errno = 0;
	CHECK(ibv_create_qp(pd, &ia) == NULL && errno == EINVAL);
	ia.cap.max_inline_data = 256;
	struct ibv_qp *in = ibv_create_qp(pd, &ia);
	CHECK(in && ia.cap.max_inline_data >= 256);
	CHECK(ibv_destroy_qp(in) == 0);
	struct ibv_sge longer = { .addr = (uintptr_t)buf + 1024, .length = 257 };
	struct ibv_send_wr iw = { .wr_id = 10, .sg_list = &longer, .num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = (uintptr_t)buf + 3072, .rkey = mr->rkey } };
	bad = NULL;
	CHECK(ibv_post_send(n, &iw, &bad) == EINVAL && bad == &iw);
	/* Refused before a byte is copied: 1 GiB from a 4 KiB buffer. */
	longer.length = 1u << 30;
	CHECK(ibv_post_send(n, &iw, &bad) == EINVAL && bad == &iw);
	longer.length = 256;
	memset(buf + 1024, 0x5A, 256);
	memset(buf + 3072, 0, 256);
	CHECK(ibv_post_send(n, &iw, &bad) == 0);
	wc = wait_wc(10);
	CHECK(wc.status == IBV_WC_SUCCESS);
	for (int i = 0; i < 256; i++)
		CHECK((unsigned char)buf[3072 + i] == 0x5A);
	/* ibv_wr_*: a batch with a request that cannot be built (inline data
	 * over 256 bytes) posts nothing, the good request before it included. */
	struct ibv_qp_ex *nx = ibv_qp_to_qp_ex(n);
	CHECK(nx);
	static char big[257];
	ibv_wr_start(nx);
	nx->wr_id = 13;
	nx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(nx, mr->rkey, (uintptr_t)buf + 3072);
	ibv_wr_set_sge(nx, mr->lkey, (uintptr_t)buf + 1024, 8);
	nx->wr_id = 14;
	ibv_wr_rdma_write(nx, mr->rkey, (uintptr_t)buf + 3072);
	ibv_wr_set_inline_data(nx, big, sizeof big);
	CHECK(ibv_wr_complete(nx) == EINVAL);
	struct ibv_sge eight = { .addr = (uintptr_t)buf + 1024, .length = 8, .lkey = mr->lkey };
	struct ibv_send_wr mark = { .wr_id = 15, .sg_list = &eight, .num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = (uintptr_t)buf + 3072, .rkey = mr->rkey } };
	CHECK(ibv_post_send(n, &mark, &bad) == 0);
	CHECK(next_wc().wr_id == 15);
	/* ATOMIC WRITE through ibv_wr_*: 8 bytes stored at once; without its
	 * bytes the request is refused, nothing posted. */
	uint64_t word = 0x1122334455667788ULL;
	memset(buf + 3584, 0, 16);
	ibv_wr_start(nx);
	nx->wr_id = 16;
	nx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_atomic_write(nx, mr->rkey, (uintptr_t)buf + 3584, &word);
	CHECK(ibv_wr_complete(nx) == 0);
	wc = next_wc();
	CHECK(wc.wr_id == 16 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_ATOMIC_WRITE);
	CHECK(memcmp(buf + 3584, &word, 8) == 0 && buf[3592] == 0);
	ibv_wr_start(nx);
	ibv_wr_atomic_write(nx, mr->rkey, (uintptr_t)buf + 3584, NULL);
	CHECK(ibv_wr_complete(nx) == EFAULT);
	/* ATOMIC WRITE through ibv_post_send: the 8 bytes of its one SGE. */
	uint64_t word2 = 0x0102030405060708ULL;
	memcpy(buf + 1024, &word2, 8);
	struct ibv_sge w8 = { .addr = (uintptr_t)buf + 1024, .length = 8, .lkey = mr->lkey };
	struct ibv_send_wr aw = { .wr_id = 17, .sg_list = &w8, .num_sge = 1,
		.opcode = IBV_WR_ATOMIC_WRITE, .send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = (uintptr_t)buf + 3600, .rkey = mr->rkey } };
	CHECK(ibv_post_send(n, &aw, &bad) == 0);
	wc = next_wc();
	CHECK(wc.wr_id == 17 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_ATOMIC_WRITE);
	CHECK(memcmp(buf + 3600, &word2, 8) == 0);
	w8.length = 4;
	bad = NULL;
	CHECK(ibv_post_send(n, &aw, &bad) == EINVAL && bad == &aw);
	/* A window bind without its bind info is refused, not dropped. */
	ibv_wr_start(nx);
	ibv_wr_bind_mw(nx, NULL, 0, NULL);
	CHECK(ibv_wr_complete(nx) == EINVAL);
	/* An attribute the mask names must be valid; one it does not name is
	 * not looked at. */
	struct ibv_qp *fresh = make_qp(NULL);
	struct ibv_qp_attr st = { .qp_state = 42 };
	CHECK(ibv_modify_qp(fresh, &st, IBV_QP_STATE) == EINVAL);
	struct ibv_qp_attr rtr = { .qp_state = IBV_QPS_RTR, .path_mtu = 0, .dest_qp_num = n->qp_num,
		.max_dest_rd_atomic = 1, .min_rnr_timer = 1,
		.ah_attr = { .is_global = 1, .port_num = 1, .grh = { .dgid = gid, .hop_limit = 64 } } };
	int rtr_mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
		IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
	CHECK(ibv_modify_qp(fresh, &rtr, rtr_mask) == EINVAL);
	struct ibv_qp_attr q;
	struct ibv_qp_init_attr qi;
	CHECK(ibv_query_qp(fresh, &q, IBV_QP_STATE, &qi) == 0 && q.qp_state == IBV_QPS_INIT);
	struct ibv_qp_attr rnr = { .path_mtu = 0, .min_rnr_timer = 12 };
	CHECK(ibv_modify_qp(n, &rnr, IBV_QP_MIN_RNR_TIMER) == 0);
	CHECK(ibv_destroy_qp(fresh) == 0);
	/* A region with a window bound to it stays registered. */
	char *wbuf = calloc(1, 4096);
	struct ibv_mr *wmr = ibv_reg_mr(pd, wbuf, 4096, IBV_ACCESS_LOCAL_WRITE |
					IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_MW_BIND);
	struct ibv_mw *mw = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
	CHECK(wmr && mw);
	struct ibv_send_wr bw = { .wr_id = 11, .opcode = IBV_WR_BIND_MW,
		.send_flags = IBV_SEND_SIGNALED,
		.bind_mw = { .mw = mw, .rkey = ibv_inc_rkey(mw->rkey),
			     .bind_info = { .mr = wmr, .addr = (uintptr_t)wbuf, .length = 4096,
					    .mw_access_flags = IBV_ACCESS_REMOTE_WRITE } } };
	CHECK(ibv_post_send(n, &bw, &bad) == 0);
	CHECK(wait_wc(11).status == IBV_WC_SUCCESS);
	CHECK(ibv_dereg_mr(wmr) == EBUSY);
	struct ibv_send_wr inv = { .wr_id = 12, .opcode = IBV_WR_LOCAL_INV,
		.send_flags = IBV_SEND_SIGNALED, .invalidate_rkey = bw.bind_mw.rkey };
	CHECK(ibv_post_send(n, &inv, &bad) == 0);
	CHECK(wait_wc(12).status == IBV_WC_SUCCESS);
	CHECK(ibv_dereg_mr(wmr) == 0);
	CHECK(ibv_dealloc_mw(mw) == 0);
	free(wbuf);
	/* A completion channel with a CQ on it stays. */
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	CHECK(ch);
	struct ibv_cq *chcq = ibv_create_cq(ctx, 4, NULL, ch, 0);
	CHECK(chcq);
	CHECK(ibv_destroy_comp_channel(ch) == EBUSY);
	CHECK(ibv_destroy_cq(chcq) == 0);
	CHECK(ibv_destroy_comp_channel(ch) == 0);
	printf("misuse: foreign pointers, busy objects, long inline, masked attributes refused\n");

	rereg_paths();
	type1_window_paths();
	parent_domain_paths();
	device_memory_paths();

	/* Fork: the child has copies of the objects but not the NIC behind
	 * them. Its calls fail at once; the parent is untouched. */
	fflush(stdout);
	pid_t child = fork();
	CHECK(child >= 0);
	if (child == 0) {
		struct ibv_send_wr cw = wr;
		cw.wr.rdma.rkey = mr->rkey;
		memset(buf, 0xAA, 4096);
		if (ibv_post_send(n, &cw, &bad) != EINVAL)
			_exit(2);
		if (ibv_poll_cq(cq, 1, &wc) >= 0)
			_exit(3);
		if (ibv_destroy_qp(n) == 0 || ibv_close_device(ctx) == 0)
			_exit(4);
		struct ibv_alloc_dm_attr cda = { .length = 64 };
		struct ibv_dm *cdm = ibv_alloc_dm(ctx, &cda);
		if (!cdm || ibv_memcpy_to_dm(cdm, 0, "abcd", 4) || ibv_free_dm(cdm))
			_exit(5);
		exit(0);
	}
	int status = -1;
	for (int i = 0; i < 1000 && waitpid(child, &status, WNOHANG) == 0; i++)
		usleep(10000);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	memset(buf, 0x11, 64);
	memset(buf + 3072, 0, 64);
	struct ibv_send_wr after = { .wr_id = 9, .sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = (uintptr_t)buf + 3072, .rkey = mr->rkey } };
	CHECK(ibv_post_send(n, &after, &bad) == 0);
	wc = wait_wc(9);
	CHECK(wc.status == IBV_WC_SUCCESS);
	for (int i = 0; i < 64; i++)
		CHECK((unsigned char)buf[3072 + i] == 0x11);
	printf("fork: child refused, parent intact\n");

	CHECK(ibv_destroy_qp(g) == 0 && ibv_destroy_qp(h) == 0 && ibv_destroy_qp(k) == 0);
	CHECK(ibv_destroy_qp(m) == 0 && ibv_destroy_qp(n) == 0);
	CHECK(ibv_destroy_cq(small) == 0);
	/* A CQ a QP completes into is not destroyed (the kernel says EBUSY). */
	CHECK(ibv_destroy_cq(cq) == EBUSY);
	CHECK(ibv_destroy_qp(a) == 0 && ibv_destroy_qp(b) == 0);
	CHECK(ibv_destroy_qp(c) == 0 && ibv_destroy_qp(d) == 0);
	/* An SRQ a QP takes its receives from is not destroyed. */
	CHECK(ibv_destroy_srq(srq) == EBUSY);
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
