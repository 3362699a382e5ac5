"""fastai's Learner control flow (learner.py, 2.x), reduced to its events and exceptions, used as
the oracle for corefit's event order. Usage: fastai_loop.py DIR n_epoch n_train n_valid
[kind event epoch iter training]  -> DIR/events.txt, one event name per line."""
import sys


class CancelBatchException(Exception): pass
class CancelTrainException(Exception): pass
class CancelValidException(Exception): pass
class CancelEpochException(Exception): pass
class CancelStepException(Exception): pass
class CancelBackwardException(Exception): pass
class CancelFitException(Exception): pass


KINDS = {"batch": CancelBatchException, "train": CancelTrainException,
         "validate": CancelValidException, "epoch": CancelEpochException,
         "step": CancelStepException, "backward": CancelBackwardException,
         "fit": CancelFitException}


# fastai's _inner_loop events (a callback's run_train/run_valid apply to these)
INNER = {"before_batch", "after_pred", "after_loss", "before_backward", "after_cancel_backward",
         "after_backward", "before_step", "after_cancel_step", "after_step", "after_cancel_batch",
         "after_batch"}


class Sim:
    def __init__(self, n_epoch, n_train, n_valid, cancel):
        self.n_epoch, self.n_train, self.n_valid, self.cancel = n_epoch, n_train, n_valid, cancel
        self.log, self.training, self.epoch, self.iter = [], False, 0, 0

    def __call__(self, ev):
        self.log.append(ev)
        c = self.cancel
        inner = ev in INNER
        if (c and ev == c[1] and self.epoch == c[2] and (not inner or self.iter == c[3])
                and self.training == c[4]):
            self.cancel = None  # raise once
            raise KINDS[c[0]]()

    def _with_events(self, f, name, ex):
        try:
            self('before_' + name)
            f()
        except ex:
            self('after_cancel_' + name)
        self('after_' + name)

    def _do_one_batch(self):
        self('after_pred')
        self('after_loss')
        if not self.training:
            return
        self._with_events(lambda: None, 'backward', CancelBackwardException)
        self._with_events(lambda: None, 'step', CancelStepException)

    def all_batches(self, n):
        for i in range(n):
            self.iter = i
            self._with_events(self._do_one_batch, 'batch', CancelBatchException)

    def _do_epoch_train(self):
        self.iter = 0

        def body():
            self.training = True
            self.all_batches(self.n_train)
        self.training = True  # TrainEvalCallback.before_train runs inside before_train
        self._with_events(body, 'train', CancelTrainException)

    def _do_epoch_validate(self):
        self.iter = 0
        self.training = False  # TrainEvalCallback.before_validate
        self._with_events(lambda: self.all_batches(self.n_valid), 'validate', CancelValidException)

    def _do_epoch(self):
        self._do_epoch_train()
        self._do_epoch_validate()

    def _do_fit(self):
        for epoch in range(self.n_epoch):
            self.epoch = epoch
            self._with_events(self._do_epoch, 'epoch', CancelEpochException)

    def fit(self):
        self._with_events(self._do_fit, 'fit', CancelFitException)


def main():
    d = sys.argv[1]
    n_epoch, n_train, n_valid = map(int, sys.argv[2:5])
    cancel = None
    if len(sys.argv) > 5:
        kind, event, epoch, it, training = sys.argv[5:10]
        cancel = (kind, event, int(epoch), int(it), training == "1")
    sim = Sim(n_epoch, n_train, n_valid, cancel)
    sim.fit()
    with open(d + "/events.txt", "w") as f:
        f.write("\n".join(sim.log) + "\n")


main()
