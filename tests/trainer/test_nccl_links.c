/* The NCCL communicator's group arithmetic, without a GPU: for every layout
 * up to 2 x 5 x 2 ranks, each pipeline message's sender and receiver must
 * pick the same link (kind and first member), each naming the other as its
 * peer, and every group kind must hold at most one group per rank with
 * members numbered 0 .. members - 1. comm_nccl.c's functions are static: it
 * is compiled into this test (its comm_nccl_create shadows the library's).
 * The ring's wrap (the last stage's next, the first's previous) has no link:
 * it goes through the host communicator. */
#include <criterion/criterion.h>

#include "../../trainer/comm_nccl.c"

/* The placement of `rank` in a tp x pp x dp layout. */
static comm placed(int rank, int tp, int pp, int dp)
{
    comm c = {0};
    cr_assert_eq(comm_place(&c, rank, tp * pp * dp, tp, pp, dp), TP_OK, "%s", tp_errmsg());
    return c;
}

/* A stand-in for the groups a rank joins: groups[kind] is non-NULL exactly
 * when group_of says the rank is a member, and encodes (kind, leader). */
static nccl_comm joined(const comm *c, char *tokens)
{
    nccl_comm n = {0};
    for (int kind = 0; kind < ALL_KINDS; kind++) {
        int members, member, leader;
        group_of(c, kind, &members, &member, &leader);
        if (members > 0) n.groups[kind] = (cuda_group *)(tokens + kind * c->world + leader);
    }
    return n;
}

static void check_layout(int tp, int pp, int dp)
{
    int world = tp * pp * dp;
    char *tokens = calloc((size_t)ALL_KINDS * world, 1); /* addresses only: never read */
    cr_assert(tokens);
    for (int rank = 0; rank < world; rank++) {
        comm c = placed(rank, tp, pp, dp);
        nccl_comm n = joined(&c, tokens);
        for (int kind = 0; kind < ALL_KINDS; kind++) {
            int members, member, leader;
            group_of(&c, kind, &members, &member, &leader);
            if (!members) continue;
            cr_assert(member >= 0 && member < members && leader >= 0 && leader < world,
                      "tp%d pp%d dp%d rank %d kind %d: member %d of %d, leader %d", tp, pp, dp, rank, kind, member,
                      members, leader);
        }
        const comm_peer peers[2] = {COMM_NEXT_STAGE, COMM_PREV_STAGE};
        for (int p = 0; p < 2; p++) {
            int stage = c.pp_rank + (peers[p] == COMM_NEXT_STAGE ? 1 : -1), other_send, other_recv;
            cuda_group *send_link = link_to(&n, &c, peers[p], 1, &other_send);
            cuda_group *recv_link = link_to(&n, &c, peers[p], 0, &other_recv);
            if (stage < 0 || stage >= pp) {
                cr_assert(!send_link && !recv_link, "tp%d pp%d dp%d rank %d: a link past the pipeline's end", tp, pp,
                          dp, rank);
                continue;
            }
            cr_assert(send_link && recv_link && send_link != recv_link,
                      "tp%d pp%d dp%d rank %d: one link each way to stage %d", tp, pp, dp, rank, stage);
            /* The neighbour: same TP rank and replica, the other stage. */
            comm peer = placed(rank + (stage - c.pp_rank) * tp, tp, pp, dp);
            cr_assert_eq(peer.pp_rank, stage);
            nccl_comm pn = joined(&peer, tokens);
            comm_peer back = peers[p] == COMM_NEXT_STAGE ? COMM_PREV_STAGE : COMM_NEXT_STAGE;
            int peer_other_recv, peer_other_send;
            cuda_group *peer_recv = link_to(&pn, &peer, back, 0, &peer_other_recv);
            cuda_group *peer_send = link_to(&pn, &peer, back, 1, &peer_other_send);
            cr_assert_eq(send_link, peer_recv, "tp%d pp%d dp%d rank %d: sends to stage %d on a link it receives on",
                         tp, pp, dp, rank, stage);
            cr_assert_eq(recv_link, peer_send, "tp%d pp%d dp%d rank %d: receives from stage %d on a link it sends on",
                         tp, pp, dp, rank, stage);
            /* Member numbers: each side names the other. */
            int kind = (int)(((char *)send_link - tokens) / world), members, member, leader;
            group_of(&c, kind, &members, &member, &leader);
            cr_assert_eq(members, 2);
            cr_assert_eq(other_send, 1 - member, "rank %d names itself as its peer", rank);
            group_of(&peer, kind, &members, &member, &leader);
            cr_assert_eq(peer_other_recv, 1 - member, "rank %d's peer names itself", rank);
        }
    }
    free(tokens);
}

Test(nccl_links, every_message_has_one_link_both_ends_agree_on)
{
    for (int tp = 1; tp <= 2; tp++)
        for (int pp = 1; pp <= 5; pp++)
            for (int dp = 1; dp <= 2; dp++) check_layout(tp, pp, dp);
}

/* A wait for the first sends of a stage waits on each link for as many of
 * its own, and on the staged communicator for as many of its: here 7 sends
 * (next, prev, staged wrap, next, next, prev, staged), the first 5 of
 * which are 3 to the next stage, 1 to the previous, 1 staged. */
Test(nccl_links, a_wait_for_the_first_sends_waits_for_as_many_of_each_way)
{
    const unsigned char sent[7] = {SENT_NEXT, SENT_PREV, SENT_STAGED, SENT_NEXT, SENT_NEXT, SENT_PREV, SENT_STAGED};
    int64_t ways[SENT_WAYS];
    sends_per_way(sent, 7, 5, ways);
    cr_assert(ways[SENT_NEXT] == 3 && ways[SENT_PREV] == 1 && ways[SENT_STAGED] == 1, "%lld %lld %lld",
              (long long)ways[SENT_NEXT], (long long)ways[SENT_PREV], (long long)ways[SENT_STAGED]);
    sends_per_way(sent, 7, 0, ways);
    cr_assert(ways[SENT_NEXT] == 0 && ways[SENT_PREV] == 0 && ways[SENT_STAGED] == 0);
    sends_per_way(sent, 7, 100, ways); /* more than were sent: all of them */
    cr_assert(ways[SENT_NEXT] == 3 && ways[SENT_PREV] == 2 && ways[SENT_STAGED] == 2);
}
