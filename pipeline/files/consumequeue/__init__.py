"""The ConsumeQueue: a queue's 20-byte units in fixed-size files (:mod:`.queue`, where the unit's
layout is drawn), where a queue ends as its files say without loading it (:mod:`.ends`), and
the queue offset of a store time (:mod:`.bytime`)."""
