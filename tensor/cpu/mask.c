/* mask ops: being written. */
typedef int dg__placeholder_mask;
