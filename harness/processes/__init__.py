"""What each wirebench process does for itself: freeze its startup heap, stop when its parent is gone."""
