/* loss ops: being written. */
typedef int dg__placeholder_loss;
